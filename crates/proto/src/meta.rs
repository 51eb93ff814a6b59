//! Metadata contexts: what NBD_OPT_LIST_META_CONTEXT lists and
//! NBD_OPT_SET_META_CONTEXT selects for NBD_CMD_BLOCK_STATUS.
//!
//! The contexts are `base:allocation` (every export) and, per dirty bitmap
//! an export keeps, `qemu:dirty-bitmap:NAME` (flag 1: dirty), as qemu-nbd
//! names them. Query syntax, as the spec and qemu's NBD docs give it:
//! - LIST with no query lists every context of the export;
//! - a namespace alone (`base:`, `qemu:`) lists every context in it, and
//!   `qemu:dirty-bitmap:` every dirty bitmap;
//! - otherwise a query names one context, and SET selects only exact names;
//! - queries in namespaces this server does not know match nothing, and a
//!   query with no namespace (no `:`) is invalid.

use crate::consts::BASE_ALLOCATION;

/// The namespace of qemu's contexts.
pub const QEMU_NAMESPACE: &str = "qemu:";
/// The prefix of a dirty bitmap's context name.
pub const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";

/// The context id of `base:allocation`; a dirty bitmap's is 2 + its index
/// among its export's bitmaps when the client negotiated.
const ALLOCATION_ID: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaContext {
    Allocation,
    /// A dirty bitmap, by its name (without the prefix).
    DirtyBitmap(String),
}

impl MetaContext {
    pub fn name(&self) -> String {
        match self {
            MetaContext::Allocation => BASE_ALLOCATION.to_string(),
            MetaContext::DirtyBitmap(b) => format!("{DIRTY_BITMAP_PREFIX}{b}"),
        }
    }
}

/// A context the client selected, with the id its BLOCK_STATUS chunks carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedContext {
    pub id: u32,
    pub context: MetaContext,
}

/// A LIST or SET option's data: the export and the queries.
#[derive(Debug)]
pub(crate) struct MetaRequest<'a> {
    pub export: &'a str,
    pub queries: Vec<&'a str>,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads a length-prefixed (u32) UTF-8 string at `*pos`, advancing it.
pub(crate) fn take_string<'a>(data: &'a [u8], pos: &mut usize) -> Option<&'a str> {
    let len = data.get(*pos..pos.checked_add(4)?).map(be32)? as usize;
    *pos += 4;
    let s = data.get(*pos..pos.checked_add(len)?)?;
    *pos += len;
    std::str::from_utf8(s).ok()
}

/// Parses the option data; `Err` is the message of an NBD_REP_ERR_INVALID.
pub(crate) fn parse(data: &[u8]) -> Result<MetaRequest<'_>, &'static str> {
    let mut pos = 0;
    let export = take_string(data, &mut pos).ok_or("malformed request")?;
    let count = data
        .get(pos..pos + 4)
        .map(be32)
        .ok_or("malformed request")?;
    pos += 4;
    // Each query takes at least its 4-byte length: a count beyond what the
    // data holds is malformed, and no vector that large is reserved.
    if u64::from(count) * 4 > (data.len() - pos) as u64 {
        return Err("more queries than data");
    }
    let mut queries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let q = take_string(data, &mut pos).ok_or("malformed query")?;
        if !q.contains(':') {
            return Err("a query starts with a namespace (`base:`, `qemu:`)");
        }
        queries.push(q);
    }
    if pos != data.len() {
        return Err("trailing data");
    }
    Ok(MetaRequest { export, queries })
}

/// Every context of an export with these dirty bitmaps.
fn all(bitmaps: &[String]) -> impl Iterator<Item = MetaContext> + '_ {
    let dirty = bitmaps.iter().map(|b| MetaContext::DirtyBitmap(b.clone()));
    std::iter::once(MetaContext::Allocation).chain(dirty)
}

/// Whether LIST's query `q` matches context `c`.
fn lists(q: &str, c: &MetaContext) -> bool {
    let name = c.name();
    match c {
        MetaContext::Allocation => q == "base:" || q == name,
        MetaContext::DirtyBitmap(_) => q == QEMU_NAMESPACE || q == DIRTY_BITMAP_PREFIX || q == name,
    }
}

/// The contexts LIST answers with, each once, in the export's order.
pub(crate) fn list(queries: &[&str], bitmaps: &[String]) -> Vec<MetaContext> {
    all(bitmaps)
        .filter(|c| queries.is_empty() || queries.iter().any(|q| lists(q, c)))
        .collect()
}

/// The contexts SET selects (exact names only), each once, in the
/// export's order, with their ids.
pub(crate) fn select(queries: &[&str], bitmaps: &[String]) -> Vec<SelectedContext> {
    all(bitmaps)
        .enumerate()
        .filter(|(_, c)| queries.iter().any(|q| *q == c.name()))
        .map(|(k, context)| SelectedContext {
            id: ALLOCATION_ID + k as u32,
            context,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A LIST or SET option's data: export `export`, these queries.
    pub(crate) fn data(export: &str, queries: &[&str]) -> Vec<u8> {
        let mut d = (export.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        d
    }

    fn names(cs: &[MetaContext]) -> Vec<String> {
        cs.iter().map(MetaContext::name).collect()
    }

    fn bitmaps() -> Vec<String> {
        vec!["backup".into(), "other".into()]
    }

    #[test]
    fn list_by_namespace_prefix_and_name() {
        let b = bitmaps();
        let every = [
            "base:allocation",
            "qemu:dirty-bitmap:backup",
            "qemu:dirty-bitmap:other",
        ];
        assert_eq!(names(&list(&[], &b)), every);
        assert_eq!(names(&list(&["qemu:"], &b)), every[1..]);
        assert_eq!(names(&list(&["qemu:dirty-bitmap:"], &b)), every[1..]);
        assert_eq!(names(&list(&["base:"], &b)), every[..1]);
        let one = list(&["qemu:dirty-bitmap:other", "qemu:"], &b);
        assert_eq!(names(&one), every[1..], "each context once");
        assert!(list(
            &["qemu:dirty-bitmap:nope", "x-y:z", "qemu:allocation-depth"],
            &b
        )
        .is_empty());
        assert_eq!(names(&list(&[], &[])), ["base:allocation"]);
    }

    #[test]
    fn set_takes_exact_names_with_stable_ids() {
        let b = bitmaps();
        let s = select(&["qemu:dirty-bitmap:other", "base:allocation", "qemu:"], &b);
        let got: Vec<(u32, String)> = s.iter().map(|c| (c.id, c.context.name())).collect();
        assert_eq!(
            got,
            [
                (1, "base:allocation".to_string()),
                (3, "qemu:dirty-bitmap:other".to_string())
            ]
        );
        assert!(select(
            &["qemu:dirty-bitmap:", "base:", "qemu:dirty-bitmap:backupx"],
            &b
        )
        .is_empty());
        let twice = select(
            &["qemu:dirty-bitmap:backup", "qemu:dirty-bitmap:backup"],
            &b,
        );
        assert_eq!(twice.len(), 1);
        assert_eq!(twice[0].context, MetaContext::DirtyBitmap("backup".into()));
    }

    proptest::proptest! {
        /// Any bytes parse or are refused, never panic; and whatever SET
        /// selects, LIST with the same queries lists.
        #[test]
        fn parsing_never_panics_and_set_is_within_list(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            picks in proptest::collection::vec(0usize..9, 0..6),
        ) {
            let _ = parse(&bytes);
            let pool = ["base:", "base:allocation", "qemu:", "qemu:dirty-bitmap:",
                "qemu:dirty-bitmap:backup", "qemu:dirty-bitmap:other", "qemu:dirty-bitmap:b",
                "x-y:z", "qemu:allocation-depth"];
            let queries: Vec<&str> = picks.iter().map(|&i| pool[i]).collect();
            let request = data("e", &queries);
            let parsed = parse(&request).expect("well formed");
            proptest::prop_assert_eq!(&parsed.queries, &queries);
            let listed = list(&queries, &bitmaps());
            let selected = select(&queries, &bitmaps());
            for c in &selected {
                proptest::prop_assert!(listed.contains(&c.context), "{c:?} not listed");
            }
            let mut ids: Vec<u32> = selected.iter().map(|c| c.id).collect();
            ids.dedup();
            proptest::prop_assert_eq!(ids.len(), selected.len(), "unique ids");
        }
    }

    #[test]
    fn malformed_requests_are_refused() {
        assert!(parse(&data("e", &["base:allocation"])).is_ok());
        assert!(parse(&data("e", &[])).is_ok_and(|r| r.queries.is_empty()));
        assert!(parse(&data("e", &["noNamespace"])).is_err());
        let mut trailing = data("e", &["qemu:"]);
        trailing.push(0);
        assert!(parse(&trailing).is_err());
        let mut huge = data("e", &[]);
        let at = huge.len() - 4;
        huge[at..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse(&huge).is_err());
        let short = data("e", &["qemu:dirty-bitmap:backup"]);
        for cut in 0..short.len() {
            assert!(parse(&short[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad_utf8 = data("e", &["qemu:x"]);
        let last = bad_utf8.len() - 1;
        bad_utf8[last] = 0xff;
        assert!(parse(&bad_utf8).is_err());
    }
}
