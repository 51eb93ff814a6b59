//! `ceil_u64` against `f64::ceil`.

use super::ceil_u64;

#[test]
fn ceil_u64_is_ceil_as_u64() {
    let edges = [
        0.0,
        -0.0,
        0.3,
        -0.5,
        -3.7,
        1.0,
        1.5,
        4_096.000_000_1,
        (1u64 << 52) as f64 + 0.5,
        (1u64 << 53) as f64,
        (1u64 << 53) as f64 + 2.0,
        1.5e19,
        u64::MAX as f64,
        1e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
    ];
    // And a spread of magnitudes, whole and not.
    let spread = (0..2_000).map(|i| 1.37f64.powi(i % 140) * (1.0 + f64::from(i) * 1e-3));
    for x in edges.into_iter().chain(spread) {
        assert_eq!(ceil_u64(x), x.ceil() as u64, "{x}");
    }
}
