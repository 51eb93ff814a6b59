//! Whether a probe may write to a target. Writes destroy data, so they need
//! the path named with `--destructive`, and a block device must hold no
//! mounted or on-disk filesystem, partition table or stacked device.

use std::path::{Path, PathBuf};

use bdev::identity::{device_numbers, sysfs_disk};

/// The filesystem, swap or partition table whose signature starts `head`
/// (the first 68 KiB of a device), if any.
pub fn signature(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    [
        (1080, &[0x53, 0xEF][..], "ext2/3/4 filesystem"),
        (0, b"XFSB", "XFS filesystem"),
        (65600, b"_BHRfS_M", "btrfs filesystem"),
        (4086, b"SWAPSPACE2", "swap area"),
        (3, b"NTFS    ", "NTFS filesystem"),
        (0, b"\xEB\x3C\x90", "FAT filesystem"),
        (0, b"\xEB\x58\x90", "FAT filesystem"),
        (512, b"EFI PART", "GPT partition table"),
        (0, b"LUKS\xBA\xBE", "LUKS volume"),
    ]
    .into_iter()
    .find(|(off, magic, _)| at(*off, magic))
    .map(|(_, _, name)| name)
    .or_else(|| (at(510, &[0x55, 0xAA]) && head.len() >= 512).then_some("MBR partition table"))
}

/// Whether a probe may write to a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writes {
    Allowed,
    /// Not named with --destructive: the probe measures reads only.
    NotNamed(String),
    /// Named, but it holds data in use or a filesystem: an error.
    Unsafe(String),
}

/// Whether writes to `path` are allowed, and why not.
pub fn check_writes(path: &Path, destructive: &[PathBuf]) -> Writes {
    let named = destructive
        .iter()
        .any(|d| d == path || std::fs::canonicalize(d).ok() == std::fs::canonicalize(path).ok());
    if !named {
        return Writes::NotNamed(format!(
            "{}: writes destroy its data; name it with --destructive {} to measure writes",
            path.display(),
            path.display()
        ));
    }
    if let Some(why) = in_use(path) {
        return Writes::Unsafe(format!(
            "{}: {why}; refusing to write to it",
            path.display()
        ));
    }
    let mut head = vec![0u8; 68 << 10];
    let n = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
        .unwrap_or(0);
    match signature(&head[..n]) {
        Some(what) => Writes::Unsafe(format!(
            "{} holds a {what}; refusing to write to it (wipe it first if it is really unused)",
            path.display()
        )),
        None => Writes::Allowed,
    }
}

/// A block device (or one of its partitions) that is mounted or held by
/// another device (LVM, md, dm-crypt).
fn in_use(path: &Path) -> Option<String> {
    let (major, minor, is_block) = device_numbers(path).ok()?;
    if !is_block {
        return None;
    }
    let disk = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let mut devs = vec![(disk.clone(), format!("{major}:{minor}"))];
    if sysfs_disk(major, minor).as_ref() == Some(&disk) {
        for entry in std::fs::read_dir(&disk).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.join("partition").exists() {
                let dev = std::fs::read_to_string(p.join("dev")).unwrap_or_default();
                devs.push((p, dev.trim().to_string()));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for (dir, dev) in &devs {
        let name = dir.file_name().map(|n| n.to_string_lossy().to_string());
        let name = name.unwrap_or_default();
        if let Some(line) = mounts.lines().find(|l| l.split(' ').nth(2) == Some(dev)) {
            let at = line.split(' ').nth(4).unwrap_or("?");
            return Some(format!("{name} is mounted at {at}"));
        }
        let holders = std::fs::read_dir(dir.join("holders"))
            .into_iter()
            .flatten()
            .count();
        if holders > 0 {
            return Some(format!("{name} is held by {holders} other device(s)"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_recognised() {
        let mut head = vec![0u8; 68 << 10];
        assert_eq!(signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xEF;
        assert_eq!(signature(&head), Some("ext2/3/4 filesystem"));
        let mut gpt = vec![0u8; 4096];
        gpt[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(signature(&gpt), Some("GPT partition table"));
        let mut mbr = vec![0u8; 512];
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        assert_eq!(signature(&mbr), Some("MBR partition table"));
        assert_eq!(signature(&[]), None);
    }

    #[test]
    fn unnamed_or_filesystem_holding_paths_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("img");
        std::fs::write(&path, vec![0u8; 8192]).expect("write");
        let Writes::NotNamed(why) = check_writes(&path, &[]) else {
            panic!("refused without --destructive");
        };
        assert!(why.contains("--destructive"), "{why}");
        assert_eq!(
            check_writes(&path, std::slice::from_ref(&path)),
            Writes::Allowed
        );
        let mut fs = vec![0u8; 8192];
        fs[0..4].copy_from_slice(b"XFSB");
        std::fs::write(&path, fs).expect("write");
        let Writes::Unsafe(why) = check_writes(&path, std::slice::from_ref(&path)) else {
            panic!("refused: holds XFS");
        };
        assert!(why.contains("XFS"), "{why}");
    }

    /// The block device of a mounted filesystem (the root's, on most
    /// machines) is refused as mounted, even when named. Only reads.
    #[test]
    fn a_mounted_block_device_is_refused() {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let mounted = mounts.lines().find_map(|l| {
            let source = l.split(" - ").nth(1)?.split(' ').nth(1)?;
            let path = PathBuf::from(source);
            let is_block = device_numbers(&path).is_ok_and(|d| d.2);
            (source.starts_with("/dev/") && is_block).then_some(path)
        });
        let Some(dev) = mounted else {
            eprintln!("skipped: no mounted block device visible here");
            return;
        };
        let Writes::Unsafe(why) = check_writes(&dev, std::slice::from_ref(&dev)) else {
            panic!("{}: a mounted device must be refused", dev.display());
        };
        assert!(why.contains("is mounted at"), "{why}");
    }
}
