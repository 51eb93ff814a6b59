//! Reading a TOML file so that every error names the file, line and field:
//! [`read_text`] reads it (regular files only, bounded), [`from_toml`]
//! deserializes it, [`locate`] finds the line of a table or field for
//! errors of the checks that come after. The target's config and the
//! tools' scenario and spec files all read through it.

use std::fmt;
use std::io::Read as _;
use std::path::Path;

/// 1-based line number of byte offset `pos`.
fn line_of(text: &str, pos: usize) -> usize {
    text[..pos.min(text.len())].matches('\n').count() + 1
}

/// The key on the line holding `pos`, if that line is `key = value`.
fn key_at(text: &str, pos: usize) -> Option<String> {
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
fn backticked(msg: &str) -> Option<String> {
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

/// A configuration error: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Largest config file read; anything bigger is not a config.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A config file's text; failing to read it is an error naming the file.
/// Only regular files are read: a FIFO or a device such as /dev/urandom
/// would block or never end.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    let error = |message: String| ConfigError {
        file: path.display().to_string(),
        line: None,
        field: None,
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(error("not a regular file".into()));
    }
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(error(format!(
            "{} bytes: larger than {MAX_CONFIG_BYTES}, not a config file",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES).read_to_string(&mut text))
        .map_err(|e| error(format!("cannot read: {e}")))?;
    Ok(text)
}

/// Deserializes TOML text; a syntax or type error names the file, line and field.
pub fn from_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    source_name: &str,
) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let field = e
            .span()
            .and_then(|s| key_at(text, s.start))
            .or_else(|| backticked(e.message()));
        ConfigError {
            file: source_name.to_string(),
            line,
            field,
            message: e.message().trim().to_string(),
        }
    })
}
