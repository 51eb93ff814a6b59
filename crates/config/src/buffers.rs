//! `[buffers]`: the data buffer pool and the largest request.

use bdev::ByteSize;
use pool::PoolConfig;
use serde::Deserialize;

use crate::{bounds, ConfigError, LoadedConfig, DEFAULT_MAX_REQUEST_BYTES, MAX_REQUEST_LIMIT};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferConfig {
    #[serde(default = "default_num_buffers")]
    pub num_shared_buffers: u32,
    #[serde(default = "default_buffer_size")]
    pub buffer_size: ByteSize,
    #[serde(default = "default_cache")]
    pub buf_cache_size: u32,
    /// Small buffers: sizes double from `small_buffer_size` while below
    /// `buffer_size`, each class `num_small_buffers x small_buffer_size`
    /// bytes, and an IO takes one buffer of the smallest class it fits
    /// instead of `buffer_size` pieces (0, or a size not below
    /// `buffer_size`: none).
    #[serde(default = "default_num_small_buffers")]
    pub num_small_buffers: u32,
    #[serde(default = "default_small_buffer_size")]
    pub small_buffer_size: ByteSize,
    /// Largest READ or WRITE a client may send (advertised as the maximum
    /// block size). Large requests stream through a few buffers at a time,
    /// so this does not have to fit in the pool.
    #[serde(default = "default_max_request_size")]
    pub max_request_size: ByteSize,
}

fn default_num_buffers() -> u32 {
    1024
}
fn default_buffer_size() -> ByteSize {
    ByteSize(128 << 10)
}
fn default_cache() -> u32 {
    32
}
/// From SPDK's iobuf small pool (8 KiB): 64 MiB for each class (8, 16, 32
/// and 64 KiB with 128 KiB buffers), mapped without reserve and touched as
/// used.
fn default_num_small_buffers() -> u32 {
    8192
}
fn default_small_buffer_size() -> ByteSize {
    ByteSize(8 << 10)
}
/// Most bytes one small class may map (each class is mapped whole).
pub const MAX_SMALL_CLASS_BYTES: u64 = 16 << 30;

impl BufferConfig {
    /// The pool these settings make: no small buffers unless they are
    /// smaller than the large ones.
    pub fn pool(&self) -> PoolConfig {
        let small = self.small_buffer_size.0 as u32;
        let large = self.buffer_size.0 as u32;
        PoolConfig {
            num_small_buffers: if small < large {
                self.num_small_buffers
            } else {
                0
            },
            small_buffer_size: small,
            ..PoolConfig::large_only(self.num_shared_buffers, large, self.buf_cache_size)
        }
    }

    /// Semantic checks of `[buffers]`.
    pub(crate) fn check(&self, at: &LoadedConfig) -> Result<(), ConfigError> {
        let b = self;
        let size = b.buffer_size.0;
        if size < 4096 || !size.is_multiple_of(4096) || size > (16 << 20) {
            return Err(at.error_at(
                "buffers",
                0,
                "buffer_size",
                format!("must be a multiple of 4 KiB between 4 KiB and 16 MiB, got {size}"),
            ));
        }
        let field = |e| at.field_error("buffers", e);
        bounds::in_range(
            "num_shared_buffers",
            b.num_shared_buffers,
            1,
            bounds::MAX_SHARED_BUFFERS,
        )
        .map_err(field)?;
        bounds::in_range("buf_cache_size", b.buf_cache_size, 0, b.num_shared_buffers)
            .map_err(field)?;
        bounds::in_range(
            "num_small_buffers",
            b.num_small_buffers,
            0,
            bounds::MAX_SHARED_BUFFERS,
        )
        .map_err(field)?;
        let small = b.small_buffer_size.0;
        if small < 4096 || !small.is_multiple_of(4096) || small > (16 << 20) {
            return Err(at.error_at(
                "buffers",
                0,
                "small_buffer_size",
                format!("must be a multiple of 4 KiB between 4 KiB and 16 MiB, got {small}"),
            ));
        }
        let class_bytes = u64::from(b.num_small_buffers) * small;
        if class_bytes > MAX_SMALL_CLASS_BYTES {
            return Err(at.error_at(
                "buffers",
                0,
                "num_small_buffers",
                format!(
                    "x small_buffer_size is {class_bytes} bytes for each small class, \
                     more than {MAX_SMALL_CLASS_BYTES}"
                ),
            ));
        }
        let max = b.max_request_size.0;
        if max < 4096 || !max.is_multiple_of(4096) || max > u64::from(MAX_REQUEST_LIMIT) {
            return Err(at.error_at(
                "buffers",
                0,
                "max_request_size",
                format!(
                    "must be a multiple of 4 KiB between 4 KiB and {MAX_REQUEST_LIMIT} bytes, got {max}"
                ),
            ));
        }
        Ok(())
    }
}
fn default_max_request_size() -> ByteSize {
    ByteSize(u64::from(DEFAULT_MAX_REQUEST_BYTES))
}

impl Default for BufferConfig {
    fn default() -> Self {
        BufferConfig {
            num_shared_buffers: default_num_buffers(),
            buffer_size: default_buffer_size(),
            buf_cache_size: default_cache(),
            num_small_buffers: default_num_small_buffers(),
            small_buffer_size: default_small_buffer_size(),
            max_request_size: default_max_request_size(),
        }
    }
}
