//! Deterministic discrete-event simulator driving the `pace` crate.
