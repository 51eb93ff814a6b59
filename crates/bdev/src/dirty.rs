//! Dirty bitmaps for incremental backup: which blocks of an export were
//! written (WRITE, WRITE_ZEROES, TRIM) since the bitmap was added or last
//! cleared, served as the `qemu:dirty-bitmap:NAME` metadata context.
//!
//! A bitmap is one bit per `granularity` bytes in atomic words, shared by
//! every reactor: a write sets its blocks' bits with one `fetch_or` per
//! word, and only when one of them is still clear, so the steady state of a
//! write to already dirty blocks is a load. An export's bitmaps can be
//! added and removed while serving; each reactor keeps its own copy of the
//! list ([`DirtyMarks`]) and refreshes it only when the export's generation
//! changes, so the write path takes no lock.
//!
//! Bitmaps live in memory; an export with a bitmap file saves them at a
//! clean shutdown and restores them at start ([`crate::dirty_file`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::push_extent;

/// The default granularity, as qemu's (64 KiB).
pub const DEFAULT_GRANULARITY: u64 = 64 << 10;
/// The granularities a bitmap takes, as qemu's: a power of two in 512 B..=2 GiB.
pub const MIN_GRANULARITY: u64 = 512;
pub const MAX_GRANULARITY: u64 = 1 << 31;
/// Most extents one block-status answer gives; the client asks again from
/// where it ends, as the spec allows.
pub const MAX_EXTENTS: usize = 4096;
/// The extent flag of a dirty block (qemu's NBD_STATE_DIRTY).
pub const STATE_DIRTY: u32 = 1;

/// A bitmap name is usable in a metadata context name (at most 4096 bytes
/// with its `qemu:dirty-bitmap:` prefix) and printable.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a dirty bitmap needs a name".into());
    }
    if name.len() > 4000 {
        return Err("a dirty bitmap name is at most 4000 bytes".into());
    }
    if name.chars().any(char::is_control) {
        return Err(format!("dirty bitmap name {name:?} has control characters"));
    }
    Ok(())
}

/// A granularity is a power of two between 512 B and 2 GiB.
pub fn check_granularity(g: u64) -> Result<(), String> {
    if !g.is_power_of_two() || !(MIN_GRANULARITY..=MAX_GRANULARITY).contains(&g) {
        return Err(format!(
            "dirty bitmap granularity {g} is not a power of two from 512 to 2 GiB"
        ));
    }
    Ok(())
}

/// One dirty bitmap over an export of `size` bytes.
#[derive(Debug)]
pub struct DirtyBitmap {
    name: String,
    size: u64,
    /// log2 of the granularity.
    shift: u32,
    words: Box<[AtomicU64]>,
    /// Removed from its export: no longer marked, so it answers "all dirty"
    /// to connections that still hold it (the safe side for a backup).
    retired: AtomicBool,
}

impl DirtyBitmap {
    pub fn new(name: &str, size: u64, granularity: u64) -> Result<DirtyBitmap, String> {
        check_name(name)?;
        check_granularity(granularity)?;
        let blocks = size.div_ceil(granularity);
        let words = usize::try_from(blocks.div_ceil(64))
            .map_err(|_| format!("export of {size} bytes too large for a bitmap"))?;
        Ok(DirtyBitmap {
            name: name.to_string(),
            size,
            shift: granularity.trailing_zeros(),
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            retired: AtomicBool::new(false),
        })
    }

    /// A bitmap that is no longer kept: all dirty, at no memory cost.
    pub fn retired(name: &str, size: u64) -> DirtyBitmap {
        DirtyBitmap {
            name: name.to_string(),
            size,
            shift: MAX_GRANULARITY.trailing_zeros(),
            words: Box::new([]),
            retired: AtomicBool::new(true),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn granularity(&self) -> u64 {
        1 << self.shift
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Marks every block that `offset..offset + len` touches (rounded out to
    /// the granularity); bytes past the end are ignored.
    pub fn mark(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return;
        }
        let (first, last) = (offset >> self.shift, (end - 1) >> self.shift);
        let mut block = first;
        while block <= last {
            let (w, bit) = ((block / 64) as usize, block % 64);
            let n = (last - block + 1).min(64 - bit);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            let Some(word) = self.words.get(w) else {
                return; // a retired bitmap holds no words
            };
            if word.load(Ordering::Relaxed) & mask != mask {
                word.fetch_or(mask, Ordering::Release);
            }
            block += n;
        }
    }

    /// Every block clean: the start of a new incremental backup.
    pub fn clear(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Release);
        }
    }

    fn is_dirty(&self, block: u64) -> bool {
        let word = self.words.get((block / 64) as usize);
        word.is_none_or(|w| w.load(Ordering::Acquire) & (1 << (block % 64)) != 0)
    }

    /// The first block at or after `block`, before `end`, whose state is
    /// not `dirty` (or `end`): whole words of one state are skipped at once.
    fn run_end(&self, block: u64, dirty: bool, end: u64) -> u64 {
        let mut b = block;
        while b < end {
            let word = self.words[(b / 64) as usize].load(Ordering::Acquire);
            let same = if dirty { !word } else { word } >> (b % 64);
            if same != 0 {
                return (b + u64::from(same.trailing_zeros())).min(end);
            }
            b = (b / 64 + 1) * 64;
        }
        end
    }

    /// Extents `(length, flags)` from `offset`, covering at most `len`
    /// bytes (fewer past the end or past [`MAX_EXTENTS`] extents); flag
    /// [`STATE_DIRTY`] for dirty ones, 0 for clean. A retired bitmap is
    /// all dirty.
    pub fn extents(&self, offset: u64, len: u32) -> Vec<(u32, u32)> {
        let end = offset.saturating_add(u64::from(len)).min(self.size);
        let mut out = Vec::new();
        if offset >= end {
            return out;
        }
        if self.is_retired() {
            out.push(((end - offset) as u32, STATE_DIRTY));
            return out;
        }
        let end_block = ((end - 1) >> self.shift) + 1;
        let mut pos = offset;
        while pos < end && out.len() < MAX_EXTENTS {
            let block = pos >> self.shift;
            let dirty = self.is_dirty(block);
            let next = (self.run_end(block, dirty, end_block) << self.shift).min(end);
            debug_assert!(next > pos, "an extent is never empty");
            let flags = if dirty { STATE_DIRTY } else { 0 };
            push_extent(&mut out, (next - pos) as u32, flags);
            pos = next;
        }
        out
    }

    /// Every block dirty: what a bitmap whose history is unknown must say.
    pub fn mark_all(&self) {
        self.mark(0, self.size);
    }

    /// The words, for saving: bit `b % 64` of word `b / 64` is block `b`.
    pub fn to_words(&self) -> Vec<u64> {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Acquire))
            .collect()
    }

    /// Marks the dirty blocks of `words`, a bitmap of `granularity` over
    /// this bitmap's size (as [`DirtyBitmap::to_words`] gave), at this
    /// bitmap's granularity: a coarser one rounds out, never loses a block.
    pub fn mark_words(&self, granularity: u64, words: &[u64]) -> Result<(), String> {
        check_granularity(granularity)?;
        let want = self.size.div_ceil(granularity).div_ceil(64);
        if words.len() as u64 != want {
            return Err(format!(
                "{} words for {} bytes at granularity {granularity}, not {want}",
                words.len(),
                self.size
            ));
        }
        if granularity == self.granularity() {
            // Bits past the end are not blocks: a damaged tail adds none.
            let tail = (self.size.div_ceil(granularity) % 64) as u32;
            for (i, (to, &w)) in self.words.iter().zip(words).enumerate() {
                let keep = if i + 1 == words.len() && tail != 0 {
                    (1u64 << tail) - 1
                } else {
                    u64::MAX
                };
                to.fetch_or(w & keep, Ordering::AcqRel);
            }
            return Ok(());
        }
        for (i, &w) in words.iter().enumerate() {
            let mut bits = w;
            while bits != 0 {
                let block = i as u64 * 64 + u64::from(bits.trailing_zeros());
                bits &= bits - 1;
                self.mark(block * granularity, granularity);
            }
        }
        Ok(())
    }

    /// Bytes in dirty blocks (the last block counts only up to the end).
    pub fn dirty_bytes(&self) -> u64 {
        let blocks: u64 = self
            .words
            .iter()
            .map(|w| u64::from(w.load(Ordering::Acquire).count_ones()))
            .sum();
        let mut bytes = blocks << self.shift;
        let tail = self.size & (self.granularity() - 1);
        if tail != 0 && self.is_dirty(self.size >> self.shift) {
            bytes -= self.granularity() - tail;
        }
        bytes
    }
}

/// The dirty bitmaps of one export, shared by the reactors and the admin
/// RPC. Changing the list takes a lock and bumps the generation; marking
/// goes through each reactor's [`DirtyMarks`] and takes none.
#[derive(Debug)]
pub struct DirtyBitmaps {
    size: u64,
    list: RwLock<Arc<[Arc<DirtyBitmap>]>>,
    generation: AtomicU64,
}

impl DirtyBitmaps {
    /// An export of `size` bytes with no bitmap.
    pub fn new(size: u64) -> DirtyBitmaps {
        DirtyBitmaps {
            size,
            list: RwLock::new(Arc::from(Vec::new())),
            generation: AtomicU64::new(0),
        }
    }

    /// The export's size, which every bitmap covers.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Every bitmap, in the order they were added.
    pub fn all(&self) -> Arc<[Arc<DirtyBitmap>]> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn names(&self) -> Vec<String> {
        self.all().iter().map(|b| b.name.clone()).collect()
    }

    pub fn get(&self, name: &str) -> Option<Arc<DirtyBitmap>> {
        self.all().iter().find(|b| b.name == name).cloned()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Adds a clean bitmap; an existing name is an error.
    pub fn add(&self, name: &str, granularity: u64) -> Result<Arc<DirtyBitmap>, String> {
        let bitmap = Arc::new(DirtyBitmap::new(name, self.size, granularity)?);
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        if list.iter().any(|b| b.name == name) {
            return Err(format!("dirty bitmap `{name}` exists"));
        }
        let mut v = list.to_vec();
        v.push(bitmap.clone());
        *list = v.into();
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(bitmap)
    }

    /// Clears bitmap `name`, moving what it held into a new bitmap `into`
    /// (same granularity), word by word with atomic swaps: every mark lands
    /// in one of the two, so an incremental backup copies `into` while
    /// `name` tracks what comes after. `into` is marked by later writes
    /// too (extra blocks copied, never a change lost); remove it when done.
    pub fn snapshot(&self, name: &str, into: &str) -> Result<Arc<DirtyBitmap>, String> {
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        let Some(from) = list.iter().find(|b| b.name == name).cloned() else {
            return Err(format!("no dirty bitmap `{name}`"));
        };
        if list.iter().any(|b| b.name == into) {
            return Err(format!("dirty bitmap `{into}` exists"));
        }
        let snap = DirtyBitmap::new(into, self.size, from.granularity())?;
        for (to, w) in snap.words.iter().zip(from.words.iter()) {
            to.store(w.swap(0, Ordering::AcqRel), Ordering::Release);
        }
        let snap = Arc::new(snap);
        let mut v = list.to_vec();
        v.push(snap.clone());
        *list = v.into();
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(snap)
    }

    /// Removes a bitmap; connections that selected it see it all dirty.
    pub fn remove(&self, name: &str) -> Result<(), String> {
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        let Some(gone) = list.iter().find(|b| b.name == name).cloned() else {
            return Err(format!("no dirty bitmap `{name}`"));
        };
        gone.retire();
        *list = list.iter().filter(|b| b.name != name).cloned().collect();
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

/// A reactor's view of every export's bitmaps: the lists as of the
/// generation it last saw, so a write marks them without a lock.
#[derive(Debug, Default)]
pub struct DirtyMarks {
    seen: Vec<(u64, Arc<[Arc<DirtyBitmap>]>)>,
}

impl DirtyMarks {
    /// Marks `offset..offset + len` in every bitmap of `export`, whose
    /// bitmaps are `set`.
    pub fn mark(&mut self, export: usize, set: &DirtyBitmaps, offset: u64, len: u64) {
        if self.seen.len() <= export {
            self.seen
                .resize_with(export + 1, || (u64::MAX, Arc::from(Vec::new())));
        }
        let seen = &mut self.seen[export];
        let generation = set.generation();
        if seen.0 != generation {
            // The generation is read before the list: a change between the
            // two is seen again on the next write.
            *seen = (generation, set.all());
        }
        for b in seen.1.iter() {
            b.mark(offset, len);
        }
    }
}

#[cfg(test)]
#[path = "dirty_tests.rs"]
mod tests;
