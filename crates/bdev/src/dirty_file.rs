//! Persistent dirty bitmaps: an export's bitmaps saved in a file of their
//! own, as qemu keeps persistent bitmaps in a qcow2 image.
//!
//! The file says whether it may be trusted. The server rewrites it marked
//! *in use* before it serves a write, and marked *clean*, with every bit,
//! after its last write at a clean shutdown. A start that finds it in use
//! (the server was killed or crashed), damaged, missing, or saved for an
//! export of another size cannot know which blocks changed meanwhile, so
//! every bitmap starts all dirty: the next incremental backup copies
//! everything, and no change is ever lost. Each write goes to a temporary
//! file beside it, fsynced, renamed over it, and the directory fsynced.
//!
//! Layout, little-endian: magic `IOPACEDB`, version u32, state u32 (1 in
//! use, 2 clean), export size u64, bitmap count u32; per bitmap its name
//! length u32, name (UTF-8), granularity u64, word count u64 and words u64
//! (bit `b % 64` of word `b / 64` is block `b`); then the FNV-1a 64 hash of
//! everything before it.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dirty::{check_granularity, check_name, DirtyBitmap, DirtyBitmaps};

pub const MAGIC: &[u8; 8] = b"IOPACEDB";
const VERSION: u32 = 1;
/// Most bitmaps one file holds (a sanity bound on a count read from disk).
const MAX_BITMAPS: u32 = 1 << 16;

/// What a bitmap file says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileState {
    /// Written at start: the server that wrote it may have marked more
    /// since, so its bits are not to be trusted.
    InUse = 1,
    /// Written after the last write of a clean shutdown: exact.
    Clean = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedBitmap {
    pub name: String,
    pub granularity: u64,
    pub words: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub state: FileState,
    pub size: u64,
    pub bitmaps: Vec<SavedBitmap>,
}

/// What a start finds at the bitmap file's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// No file yet.
    Missing,
    Saved(Saved),
    /// Ours (it starts with the magic, or is empty) but unreadable.
    Damaged(String),
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The file's bytes for `bitmaps` of an export of `size` bytes.
pub fn encode(state: FileState, size: u64, bitmaps: &[Arc<DirtyBitmap>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(state as u32).to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&(bitmaps.len() as u32).to_le_bytes());
    for b in bitmaps {
        debug_assert_eq!(b.size(), size, "a bitmap covers its export");
        let words = b.to_words();
        out.extend_from_slice(&(b.name().len() as u32).to_le_bytes());
        out.extend_from_slice(b.name().as_bytes());
        out.extend_from_slice(&b.granularity().to_le_bytes());
        out.extend_from_slice(&(words.len() as u64).to_le_bytes());
        for w in words {
            out.extend_from_slice(&w.to_le_bytes());
        }
    }
    let hash = fnv1a(&out);
    out.extend_from_slice(&hash.to_le_bytes());
    out
}

/// A cursor over untrusted bytes: every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("truncated at byte {}", self.at))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn bitmap(&mut self, size: u64) -> Result<SavedBitmap, String> {
        let len = self.u32()? as usize;
        let name = std::str::from_utf8(self.take(len)?).map_err(|_| "a name is not UTF-8")?;
        check_name(name)?;
        let granularity = self.u64()?;
        check_granularity(granularity)?;
        let count = self.u64()?;
        let want = size.div_ceil(granularity).div_ceil(64);
        if count != want {
            return Err(format!("bitmap `{name}` has {count} words, not {want}"));
        }
        let raw = self.take(usize::try_from(count * 8).map_err(|_| "too many words")?)?;
        let words = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Ok(SavedBitmap {
            name: name.to_string(),
            granularity,
            words,
        })
    }
}

/// The file's contents, or what is wrong with them.
pub fn decode(bytes: &[u8]) -> Result<Saved, String> {
    let Some(body_len) = bytes.len().checked_sub(8) else {
        return Err(format!("{} bytes: too short", bytes.len()));
    };
    let mut r = Reader { bytes, at: 0 };
    if r.take(8)? != MAGIC {
        return Err("no iopace bitmap magic".into());
    }
    let hash = u64::from_le_bytes(bytes[body_len..].try_into().expect("8 bytes"));
    if fnv1a(&bytes[..body_len]) != hash {
        return Err("checksum mismatch".into());
    }
    let r = &mut Reader {
        bytes: &bytes[..body_len],
        at: 8,
    };
    let version = r.u32()?;
    if version != VERSION {
        return Err(format!("version {version}, not {VERSION}"));
    }
    let state = match r.u32()? {
        1 => FileState::InUse,
        2 => FileState::Clean,
        s => return Err(format!("unknown state {s}")),
    };
    let size = r.u64()?;
    let count = r.u32()?;
    if count > MAX_BITMAPS {
        return Err(format!("{count} bitmaps, more than {MAX_BITMAPS}"));
    }
    let mut bitmaps: Vec<SavedBitmap> = Vec::new();
    for _ in 0..count {
        let b = r.bitmap(size)?;
        if bitmaps.iter().any(|o| o.name == b.name) {
            return Err(format!("bitmap `{}` is saved twice", b.name));
        }
        bitmaps.push(b);
    }
    if r.at != body_len {
        return Err(format!("{} bytes after the last bitmap", body_len - r.at));
    }
    Ok(Saved {
        state,
        size,
        bitmaps,
    })
}

/// Reads the bitmap file at `path`. Errors are what must stop a start: a
/// file that is not a bitmap file (refused rather than overwritten: a
/// path mistyped for a disk image must not lose the image), a directory,
/// one that cannot be read, or a missing directory.
pub fn read(path: &Path) -> Result<Found, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let dir = parent(path);
            if !dir.is_dir() {
                return Err(format!("directory {} does not exist", dir.display()));
            }
            return Ok(Found::Missing);
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    if bytes.is_empty() {
        return Ok(Found::Damaged("empty".into()));
    }
    if !bytes.starts_with(MAGIC) {
        return Err(format!(
            "{} is not an iopace dirty bitmap file (no `IOPACEDB` magic); \
             refusing to overwrite it",
            path.display()
        ));
    }
    Ok(decode(&bytes).map_or_else(Found::Damaged, Found::Saved))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` atomically and durably: a temporary file
/// beside it, fsynced, renamed over it, then the directory fsynced. A
/// crash leaves the old file or the new one, whole.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    let tmp = path.with_file_name(name);
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)?;
    File::open(parent(path))?.sync_all()
}

/// Writes `set`'s bitmaps to `path` in `state`.
pub fn save(path: &Path, state: FileState, set: &DirtyBitmaps) -> io::Result<()> {
    let size = set.size();
    write_atomic(path, &encode(state, size, &set.all()))
}

/// Adds to `set` (empty) the bitmaps an export keeps: the config's `names`
/// at `granularity`, then those the file saved that the config does not
/// name (added by RPC), at their own. They take the file's bits when it was
/// saved clean for this size; otherwise, or when the file lacks one, they
/// start all dirty.
pub fn restore(
    set: &DirtyBitmaps,
    names: &[String],
    granularity: u64,
    found: &Found,
) -> Result<Restored, String> {
    assert!(set.all().is_empty(), "restore fills an empty set");
    let (saved, untrusted) = match found {
        Found::Missing => (&[][..], Some("no bitmap file yet".to_string())),
        Found::Damaged(why) => (&[][..], Some(format!("the file is damaged ({why})"))),
        Found::Saved(s) if s.state == FileState::InUse => (
            &s.bitmaps[..],
            Some("the file was in use: the server did not stop cleanly".into()),
        ),
        Found::Saved(s) if s.size != set.size() => (
            &s.bitmaps[..],
            Some(format!(
                "saved for {} bytes, the export has {}",
                s.size,
                set.size()
            )),
        ),
        Found::Saved(s) => (&s.bitmaps[..], None),
    };
    let wanted = names.iter().map(|n| (n.as_str(), granularity));
    let extra = saved
        .iter()
        .filter(|s| !names.contains(&s.name))
        .map(|s| (s.name.as_str(), s.granularity));
    let mut unsaved = Vec::new();
    for (name, g) in wanted.chain(extra) {
        let b = set.add(name, g)?;
        match saved.iter().find(|s| s.name == name) {
            Some(s) if untrusted.is_none() => b.mark_words(s.granularity, &s.words)?,
            Some(_) => b.mark_all(),
            None => {
                b.mark_all();
                unsaved.push(name);
            }
        }
    }
    let note = match &untrusted {
        Some(why) => format!("every bitmap starts all dirty: {why}"),
        None if unsaved.is_empty() => "restored from a clean shutdown".into(),
        None => format!(
            "restored from a clean shutdown; not in the file, so all dirty: {}",
            unsaved.join(", ")
        ),
    };
    let all_dirty = match untrusted {
        Some(_) => set.names(),
        None => unsaved.into_iter().map(String::from).collect(),
    };
    Ok(Restored { all_dirty, note })
}

/// What [`restore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The bitmaps that start all dirty, their history unknown.
    pub all_dirty: Vec<String>,
    /// One line for the log and the RPC: restored, or why not.
    pub note: String,
}

#[cfg(test)]
#[path = "dirty_file_tests.rs"]
mod tests;
