//! Where in a TOML text a table or field is, for errors that name the
//! file, line and field.

/// 1-based line number of byte offset `pos`.
pub(crate) fn line_of(text: &str, pos: usize) -> usize {
    text[..pos.min(text.len())].matches('\n').count() + 1
}

/// The key on the line holding `pos`, if that line is `key = value`.
pub(crate) fn key_at(text: &str, pos: usize) -> Option<String> {
    let pos = pos.min(text.len());
    let start = text[..pos].rfind('\n').map_or(0, |i| i + 1);
    let end = text[pos..].find('\n').map_or(text.len(), |i| pos + i);
    let line = &text[start..end];
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_string())
}

/// The first `quoted` name in a serde message, e.g. "missing field `name`";
/// none in a syntax error's list of the tokens it expected ("expected `.`,
/// `=`"), which names no field.
pub(crate) fn backticked(msg: &str) -> Option<String> {
    let start = msg.find('`')? + 1;
    if msg[..start].contains("expected") {
        return None;
    }
    let len = msg[start..].find('`')?;
    Some(msg[start..start + len].to_string())
}

/// Line of `field` inside the `index`-th `[[table]]` (or `[table]`, an
/// inline table or a dotted key), or of the table itself when the field is
/// absent. `table` is a dotted path such as `qos.disk` or `pacing.tenants`,
/// or "" for the top level.
pub fn locate(text: &str, table: &str, index: usize, field: &str) -> Option<usize> {
    use toml_edit::{Item, Value};
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut item = doc.as_item();
    let mut span = None;
    for segment in table.split('.').filter(|s| !s.is_empty()) {
        let (key, next) = item.as_table_like()?.get_key_value(segment)?;
        span = key.span().or(span);
        item = next;
    }
    let entry: &dyn toml_edit::TableLike = match item {
        Item::ArrayOfTables(tables) => {
            let t = tables.get(index)?;
            span = t.span().or(span);
            t
        }
        Item::Value(Value::Array(values)) => {
            let v = values.get(index)?;
            span = v.span().or(span);
            v.as_inline_table()?
        }
        other => other.as_table_like()?,
    };
    if let Some((key, value)) = entry.get_key_value(field) {
        span = key.span().or(value.span()).or(span);
    }
    span.map(|s| line_of(text, s.start))
}
