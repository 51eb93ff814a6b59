//! What `serve` fails with: a config error (exit status 2) or a refusal
//! of the environment (exit status 1).

use config::ConfigError;

#[derive(Debug)]
pub enum ServeError {
    /// The configuration is wrong: exit status 2.
    Config(ConfigError),
    /// The environment refused something (bind, io_uring, memory): exit 1.
    Runtime(String),
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(e) => write!(f, "config error: {e}"),
            ServeError::Runtime(e) => write!(f, "{e}"),
        }
    }
}

pub(crate) fn runtime(what: impl std::fmt::Display) -> ServeError {
    ServeError::Runtime(what.to_string())
}
