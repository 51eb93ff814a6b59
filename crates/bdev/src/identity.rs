//! Who a device is: model, firmware, hashed serial, sizes and queue limits,
//! read from sysfs for a block device, or for the device under a file.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::Bdev;

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    pub model: String,
    pub firmware: String,
    /// FNV-1a of the serial: enough to tell runs on one drive apart,
    /// without publishing the serial.
    pub serial_hash: String,
    pub size: u64,
    pub logical_block: u32,
    pub physical_block: u32,
    pub rotational: bool,
    pub max_sectors_kb: u32,
    pub max_hw_sectors_kb: u32,
    pub nr_requests: u32,
    pub scheduler: String,
    /// The sysfs block device these came from ("" for in-memory bdevs).
    pub sysfs: String,
    /// What was probed: a block device, a file on one, or a bdev of a config.
    pub kind: String,
}

/// FNV-1a, 64 bits: stable across versions, unlike std's hasher.
pub fn fnv1a(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn read_u32(dir: &Path, file: &str) -> u32 {
    read(dir, file).parse().unwrap_or(0)
}

/// The sysfs directory of the whole disk holding `dev` (major, minor).
pub fn sysfs_disk(major: u32, minor: u32) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition's directory sits inside its disk's.
    if dir.join("partition").exists() {
        dir.parent().map(Path::to_path_buf)
    } else {
        Some(dir)
    }
}

/// (major, minor) of a block device node, or of the device holding a file.
pub fn device_numbers(path: &Path) -> std::io::Result<(u32, u32, bool)> {
    let meta = std::fs::metadata(path)?;
    let is_block = meta.file_type().is_block_device();
    let dev = if is_block { meta.rdev() } else { meta.dev() };
    Ok((libc::major(dev), libc::minor(dev), is_block))
}

/// Identity of a path: a block device's own, or the backing device's for a file.
pub fn of_path(path: &Path, bdev: &Bdev) -> Identity {
    let mut id = Identity {
        size: bdev.size(),
        kind: "file".into(),
        ..Identity::default()
    };
    let Ok((major, minor, is_block)) = device_numbers(path) else {
        return id;
    };
    if is_block {
        id.kind = "block device".into();
    } else {
        id.kind = format!("file on device {major}:{minor}");
    }
    let Some(disk) = sysfs_disk(major, minor) else {
        return id;
    };
    let dev = disk.join("device");
    id.model = read(&dev, "model");
    id.firmware = [read(&dev, "firmware_rev"), read(&dev, "rev")].concat();
    let serial = read(&dev, "serial");
    let serial = if serial.is_empty() {
        read(&disk, "serial")
    } else {
        serial
    };
    id.serial_hash = if serial.is_empty() {
        String::new()
    } else {
        fnv1a(&serial)
    };
    let q = disk.join("queue");
    id.logical_block = read_u32(&q, "logical_block_size");
    id.physical_block = read_u32(&q, "physical_block_size");
    id.rotational = read(&q, "rotational") == "1";
    id.max_sectors_kb = read_u32(&q, "max_sectors_kb");
    id.max_hw_sectors_kb = read_u32(&q, "max_hw_sectors_kb");
    id.nr_requests = read_u32(&q, "nr_requests");
    id.scheduler = read(&q, "scheduler");
    id.sysfs = disk.display().to_string();
    if id.model.is_empty() {
        // Virtual disks (virtio, loop) have no model: name them by driver.
        id.model = disk
            .file_name()
            .map(|n| {
                n.to_string_lossy()
                    .trim_end_matches(char::is_numeric)
                    .to_string()
            })
            .unwrap_or_default();
    }
    id
}

/// Identity of an in-memory bdev of a config: a model bdev names its parameters.
pub fn of_bdev(bdev: &Bdev) -> Identity {
    let (model, firmware) = match bdev.model_params() {
        Some(p) => ("iopace model".to_string(), fnv1a(&format!("{p:?}"))),
        None => (format!("iopace {}", bdev.kind()), String::new()),
    };
    Identity {
        model,
        firmware,
        size: bdev.size(),
        logical_block: bdev.block_size(),
        physical_block: bdev.block_size(),
        rotational: bdev.caps().rotational,
        kind: format!("{} bdev", bdev.kind()),
        ..Identity::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_hash_is_stable() {
        assert_eq!(fnv1a(""), "cbf29ce484222325");
        assert_eq!(fnv1a("a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn a_file_names_its_backing_device() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (major, minor, is_block) = device_numbers(dir.path()).expect("stat");
        assert!(!is_block);
        // Every mounted filesystem has a device number, real or anonymous.
        assert!(major > 0 || minor > 0);
    }
}
