//! The `trace` RPC: requests in flight and their last state changes, from
//! every reactor's trace ring (`engine/trace.rs`), for one connection or
//! for the oldest requests.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde_json::{json, Value};

use crate::engine::{TraceQuery, TracedReq};
use crate::reactor::{Msg, ReactorHandle};

/// Requests shown when the params name no count.
const DEFAULT_OLDEST: usize = 16;

/// `{"oldest": N}` (the default, 16), or `{"conn": SLOT}` with an optional
/// `"reactor"`.
pub fn query(params: &Value) -> Result<(TraceQuery, Option<usize>), String> {
    let num = |k: &str| params.get(k).and_then(Value::as_u64);
    let reactor = num("reactor").map(|r| r as usize);
    match (num("conn"), num("oldest")) {
        (Some(_), Some(_)) => Err("give \"conn\" or \"oldest\", not both".into()),
        (Some(c), None) => Ok((TraceQuery::Conn(c as u32), reactor)),
        (None, Some(n)) => Ok((TraceQuery::Oldest(n as usize), reactor)),
        (None, None)
            if params
                .as_object()
                .is_none_or(|o| o.keys().all(|k| k == "reactor")) =>
        {
            Ok((TraceQuery::Oldest(DEFAULT_OLDEST), reactor))
        }
        _ => Err("params: {\"oldest\": N} or {\"conn\": SLOT, \"reactor\": R}".into()),
    }
}

/// Asks the reactors (all, or `only`) for the requests `q` names; the
/// oldest first.
pub fn collect(reactors: &[Arc<ReactorHandle>], q: TraceQuery, only: Option<usize>) -> Value {
    let (tx, rx) = mpsc::channel();
    let mut asked = 0;
    for (i, r) in reactors.iter().enumerate() {
        if only.is_none_or(|o| o == i) {
            r.send(Msg::Trace(q, tx.clone()));
            asked += 1;
        }
    }
    drop(tx);
    let mut all: Vec<TracedReq> = Vec::new();
    for _ in 0..asked {
        match rx.recv_timeout(Duration::from_secs(2)) {
            Ok(reqs) => all.extend(reqs),
            Err(_) => break,
        }
    }
    all.sort_by(|a, b| b.age_us.total_cmp(&a.age_us));
    if let TraceQuery::Oldest(n) = q {
        all.truncate(n);
    }
    json!({ "requests": all })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_and_refuse_what_they_cannot_mean() {
        assert_eq!(query(&Value::Null), Ok((TraceQuery::Oldest(16), None)));
        assert_eq!(
            query(&json!({"conn": 3, "reactor": 1})),
            Ok((TraceQuery::Conn(3), Some(1)))
        );
        assert_eq!(
            query(&json!({"oldest": 2})),
            Ok((TraceQuery::Oldest(2), None))
        );
        assert!(query(&json!({"conn": 1, "oldest": 2})).is_err());
        assert!(query(&json!({"colour": 1})).is_err());
    }
}
