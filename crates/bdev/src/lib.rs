//! Block devices: null, malloc, file (io_uring), split and delay, resolved into flat stacks.
