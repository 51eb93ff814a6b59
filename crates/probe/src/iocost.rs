//! The Linux iocost controller's two lines, in the kernel's grammar
//! (`block/blk-iocost.c`): `io.cost.model`,
//!
//! ```text
//! MAJ:MIN ctrl=user model=linear rbps=U rseqiops=U rrandiops=U wbps=U wseqiops=U wrandiops=U
//! ```
//!
//! and `io.cost.qos`,
//!
//! ```text
//! MAJ:MIN enable=1 ctrl=user rpct=P rlat=U wpct=P wlat=U min=P max=P
//! ```
//!
//! where `U` is an unsigned integer and `P` a decimal with at most two
//! places (the kernel keeps hundredths: `95.5` is 9550). [`ModelLine`] and
//! [`QosLine`] print exactly what the kernel prints when it reads the files
//! back, and parse what it accepts when they are written: tokens in any
//! order, separated by blanks, `ctrl` and `enable` optional (a line
//! without them is the user's and enabled, as a write of parameters makes
//! it). Unlike the kernel, which keeps its current value for a parameter
//! not given, the parser asks for all six, since a line here describes a
//! device whole.

use pace::pacer::CostModel;

/// A block device's number, as the kernel names it in cgroup files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    /// 0:0, which no block device has: the number of a line written for a
    /// device that is not a kernel block device (a `model` bdev).
    pub const PLACEHOLDER: DevNum = DevNum { major: 0, minor: 0 };

    pub fn is_placeholder(self) -> bool {
        self == DevNum::PLACEHOLDER
    }
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl std::str::FromStr for DevNum {
    type Err = String;

    fn from_str(s: &str) -> Result<DevNum, String> {
        let bad = || format!("`{s}`: a device number is MAJ:MIN, e.g. 259:0");
        let (major, minor) = s.split_once(':').ok_or_else(bad)?;
        Ok(DevNum {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

/// The six coefficients of `io.cost.model`, as the kernel keeps them
/// (whole bytes and IOs a second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelParams {
    pub rbps: u64,
    pub rseqiops: u64,
    pub rrandiops: u64,
    pub wbps: u64,
    pub wseqiops: u64,
    pub wrandiops: u64,
}

const MODEL_KEYS: [&str; 6] = [
    "rbps",
    "rseqiops",
    "rrandiops",
    "wbps",
    "wseqiops",
    "wrandiops",
];

impl ModelParams {
    /// The cost model rounded to whole numbers (at least 1: the kernel
    /// divides by them).
    pub fn of(c: &CostModel) -> ModelParams {
        let u = |v: f64| (v.round() as u64).max(1);
        ModelParams {
            rbps: u(c.rbps),
            rseqiops: u(c.rseqiops),
            rrandiops: u(c.rrandiops),
            wbps: u(c.wbps),
            wseqiops: u(c.wseqiops),
            wrandiops: u(c.wrandiops),
        }
    }

    pub fn cost_model(&self) -> CostModel {
        CostModel {
            rbps: self.rbps as f64,
            rseqiops: self.rseqiops as f64,
            rrandiops: self.rrandiops as f64,
            wbps: self.wbps as f64,
            wseqiops: self.wseqiops as f64,
            wrandiops: self.wrandiops as f64,
        }
    }

    fn values(&self) -> [u64; 6] {
        [
            self.rbps,
            self.rseqiops,
            self.rrandiops,
            self.wbps,
            self.wseqiops,
            self.wrandiops,
        ]
    }

    /// `rbps=... wrandiops=...`: the parameters alone, as hwdb files hold them.
    pub fn params_text(&self) -> String {
        let kv: Vec<String> = MODEL_KEYS
            .iter()
            .zip(self.values())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        kv.join(" ")
    }

    /// Parses `rbps=... wrandiops=...` (any order, all six, no others).
    pub fn parse_params(text: &str) -> Result<ModelParams, String> {
        let mut v: [Option<u64>; 6] = [None; 6];
        for tok in text.split_ascii_whitespace() {
            let (k, val) = tok
                .split_once('=')
                .ok_or_else(|| format!("`{tok}`: not KEY=VALUE"))?;
            let i = MODEL_KEYS
                .iter()
                .position(|m| *m == k)
                .ok_or_else(|| format!("`{tok}`: not a cost model parameter"))?;
            v[i] = Some(parse_u64(k, val)?);
        }
        let get = |i: usize| v[i].ok_or_else(|| format!("{} missing", MODEL_KEYS[i]));
        let p = ModelParams {
            rbps: get(0)?,
            rseqiops: get(1)?,
            rrandiops: get(2)?,
            wbps: get(3)?,
            wseqiops: get(4)?,
            wrandiops: get(5)?,
        };
        match MODEL_KEYS.iter().zip(p.values()).find(|(_, v)| *v == 0) {
            Some((k, _)) => Err(format!("{k}=0: a device rate must be positive")),
            None => Ok(p),
        }
    }
}

/// Who sets a file's parameters: the kernel (`auto`) or the user (`user`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Ctrl {
    Auto,
    User,
}

impl Ctrl {
    fn name(self) -> &'static str {
        match self {
            Ctrl::Auto => "auto",
            Ctrl::User => "user",
        }
    }

    fn parse(v: &str) -> Result<Ctrl, String> {
        match v {
            "auto" => Ok(Ctrl::Auto),
            "user" => Ok(Ctrl::User),
            _ => Err(format!("ctrl={v}: auto or user")),
        }
    }
}

/// One line of `io.cost.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelLine {
    pub dev: DevNum,
    pub ctrl: Ctrl,
    pub params: ModelParams,
}

impl std::fmt::Display for ModelLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ctrl={} model=linear {}",
            self.dev,
            self.ctrl.name(),
            self.params.params_text()
        )
    }
}

/// The device number and the tokens after it.
fn split_dev(line: &str) -> Result<(DevNum, Vec<&str>), String> {
    let mut toks = line.split_ascii_whitespace();
    let dev = toks.next().ok_or("an empty line")?.parse()?;
    Ok((dev, toks.collect()))
}

impl std::str::FromStr for ModelLine {
    type Err = String;

    fn from_str(line: &str) -> Result<ModelLine, String> {
        let (dev, toks) = split_dev(line)?;
        let mut ctrl = Ctrl::User;
        let mut params = Vec::new();
        for tok in toks {
            match tok.split_once('=') {
                Some(("ctrl", v)) => ctrl = Ctrl::parse(v)?,
                Some(("model", "linear")) => {}
                Some(("model", v)) => return Err(format!("model={v}: only linear")),
                _ => params.push(tok),
            }
        }
        Ok(ModelLine {
            dev,
            ctrl,
            params: ModelParams::parse_params(&params.join(" "))?,
        })
    }
}

/// A percentage the kernel keeps in hundredths (`rpct`, `wpct`, `min`, `max`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Centi(pub u32);

impl Centi {
    pub fn of_percent(p: f64) -> Centi {
        Centi((p * 100.0).round().clamp(0.0, f64::from(u32::MAX)) as u32)
    }

    pub fn percent(self) -> f64 {
        f64::from(self.0) / 100.0
    }

    /// As `cgroup_parse_float(s, 2)`: `W` or `W.F`, the fraction rounded
    /// to two places.
    fn parse(key: &str, s: &str) -> Result<Centi, String> {
        let bad = || format!("{key}={s}: a number with at most two decimals, e.g. 95.50");
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let whole: u64 = whole.parse().map_err(|_| bad())?;
        // The first three digits of the fraction, rounded to two.
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        let thousandths: u64 = digits.parse().map_err(|_| bad())?;
        let v = whole
            .checked_mul(100)
            .and_then(|w| w.checked_add((thousandths + 5) / 10))
            .ok_or_else(bad)?;
        u32::try_from(v).map(Centi).map_err(|_| bad())
    }
}

impl std::fmt::Display for Centi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}", self.0 / 100, self.0 % 100)
    }
}

/// The kernel's bounds of `min` and `max`: 1% to 10000% (it clamps to them).
pub const VRATE_MIN: Centi = Centi(100);
pub const VRATE_MAX: Centi = Centi(1_000_000);

/// The six QoS parameters: each direction's latency target (the `pct`
/// percentile of IOs done within `lat` us; a `pct` of 0 sets no target)
/// and the bounds of vrate, in percent of the cost model's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QosParams {
    pub rpct: Centi,
    pub rlat: u32,
    pub wpct: Centi,
    pub wlat: u32,
    pub min: Centi,
    pub max: Centi,
}

const QOS_KEYS: [&str; 6] = ["rpct", "rlat", "wpct", "wlat", "min", "max"];

impl QosParams {
    /// `rpct=... max=...`: the parameters alone, as hwdb files hold them.
    pub fn params_text(&self) -> String {
        format!(
            "rpct={} rlat={} wpct={} wlat={} min={} max={}",
            self.rpct, self.rlat, self.wpct, self.wlat, self.min, self.max
        )
    }

    /// Parses `rpct=... max=...` (any order, all six, no others), with the
    /// kernel's checks: percentiles up to 100, `min` and `max` clamped to
    /// 1-10000% and `min` at most `max`.
    pub fn parse_params(text: &str) -> Result<QosParams, String> {
        let mut pct: [Option<Centi>; 6] = [None; 6];
        for tok in text.split_ascii_whitespace() {
            let (k, v) = tok
                .split_once('=')
                .ok_or_else(|| format!("`{tok}`: not KEY=VALUE"))?;
            let i = QOS_KEYS
                .iter()
                .position(|q| *q == k)
                .ok_or_else(|| format!("`{tok}`: not a QoS parameter"))?;
            pct[i] = Some(match k {
                "rlat" | "wlat" => {
                    let us = u32::try_from(parse_u64(k, v)?)
                        .map_err(|_| format!("{k}={v}: at most {} us", u32::MAX))?;
                    Centi(us)
                }
                "rpct" | "wpct" => match Centi::parse(k, v)? {
                    c if c.0 > 10_000 => return Err(format!("{k}={v}: at most 100")),
                    c => c,
                },
                _ => Centi::parse(k, v)?.clamp(VRATE_MIN, VRATE_MAX),
            });
        }
        let get = |i: usize| pct[i].ok_or_else(|| format!("{} missing", QOS_KEYS[i]));
        let q = QosParams {
            rpct: get(0)?,
            rlat: get(1)?.0,
            wpct: get(2)?,
            wlat: get(3)?.0,
            min: get(4)?,
            max: get(5)?,
        };
        if q.min > q.max {
            return Err(format!("min={} is above max={}", q.min, q.max));
        }
        Ok(q)
    }
}

/// One line of `io.cost.qos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QosLine {
    pub dev: DevNum,
    pub enable: bool,
    pub ctrl: Ctrl,
    pub params: QosParams,
}

impl std::fmt::Display for QosLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} enable={} ctrl={} {}",
            self.dev,
            u8::from(self.enable),
            self.ctrl.name(),
            self.params.params_text()
        )
    }
}

impl std::str::FromStr for QosLine {
    type Err = String;

    /// Any non-zero `enable` enables, as in the kernel.
    fn from_str(line: &str) -> Result<QosLine, String> {
        let (dev, toks) = split_dev(line)?;
        let (mut enable, mut ctrl) = (true, Ctrl::User);
        let mut params = Vec::new();
        for tok in toks {
            match tok.split_once('=') {
                Some(("enable", v)) => enable = parse_u64("enable", v)? != 0,
                Some(("ctrl", v)) => ctrl = Ctrl::parse(v)?,
                _ => params.push(tok),
            }
        }
        Ok(QosLine {
            dev,
            enable,
            ctrl,
            params: QosParams::parse_params(&params.join(" "))?,
        })
    }
}

fn parse_u64(key: &str, v: &str) -> Result<u64, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{key}={v}: an unsigned integer"));
    }
    v.parse()
        .map_err(|_| format!("{key}={v}: an unsigned 64-bit integer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // The lines of the iocost talk's slide (`cat /sys/fs/cgroup/io.cost.*`).
    const MODEL: &str = "259:0 ctrl=user model=linear rbps=1965196223 rseqiops=197218 rrandiops=150355 wbps=937386870 wseqiops=11516 wrandiops=31462";
    const QOS: &str =
        "259:0 enable=1 ctrl=user rpct=0.00 rlat=1708 wpct=0.00 wlat=22167 min=100.00 max=100.00";

    #[test]
    fn the_kernels_own_lines_round_trip() {
        let m: ModelLine = MODEL.parse().expect("model line");
        assert_eq!(
            m.dev,
            DevNum {
                major: 259,
                minor: 0
            }
        );
        assert_eq!((m.params.rbps, m.params.wrandiops), (1965196223, 31462));
        assert_eq!(m.to_string(), MODEL);
        let q: QosLine = QOS.parse().expect("qos line");
        assert_eq!((q.params.rlat, q.params.min), (1708, Centi(10_000)));
        assert_eq!(q.to_string(), QOS);
    }

    #[test]
    fn writes_the_kernel_accepts_parse_to_its_reading() {
        // systemd's order, tabs, a trailing newline.
        let m: ModelLine = "259:0 model=linear ctrl=user\trbps=1965196223 rseqiops=197218 rrandiops=150355 wbps=937386870 wseqiops=11516 wrandiops=31462\n"
            .parse()
            .expect("model line");
        assert_eq!(m.to_string(), MODEL);
        // Fewer decimals, parameters in another order, no enable or ctrl.
        let q: QosLine = "259:0 max=100 min=100 wlat=22167 wpct=0 rlat=1708 rpct=0"
            .parse()
            .expect("qos line");
        assert_eq!(q.to_string(), QOS);
        // Three decimals round to two, as cgroup_parse_float does.
        let q: QosLine = "8:0 rpct=95.555 rlat=1 wpct=0.5 wlat=1 min=1 max=2"
            .parse()
            .expect("rounded");
        assert_eq!(q.params.rpct, Centi(9556));
        assert_eq!(q.params.wpct, Centi(50));
        // The kernel clamps min and max to 1-10000%.
        let q: QosLine = "8:0 rpct=0 rlat=1 wpct=0 wlat=1 min=0.5 max=20000"
            .parse()
            .expect("clamped");
        assert_eq!((q.params.min, q.params.max), (VRATE_MIN, VRATE_MAX));
        let off: QosLine = "8:0 enable=0 ctrl=auto rpct=0 rlat=1 wpct=0 wlat=1 min=50 max=60"
            .parse()
            .expect("disabled");
        assert!(!off.enable && off.ctrl == Ctrl::Auto);
        assert_eq!(
            off.to_string(),
            "8:0 enable=0 ctrl=auto rpct=0.00 rlat=1 wpct=0.00 wlat=1 min=50.00 max=60.00"
        );
    }

    #[test]
    fn what_the_kernel_refuses_is_refused_with_the_token() {
        for (line, says) in [
            ("8:0 ctrl=user model=quadratic rbps=1", "model=quadratic"),
            (
                "8:0 rbps=1 rseqiops=2 rrandiops=3 wbps=4 wseqiops=5",
                "wrandiops missing",
            ),
            ("8:0 rbps=-1", "rbps=-1"),
            ("8:0 rbps=1e9", "rbps=1e9"),
            ("8:0 rbps=1 bogus=2", "bogus=2"),
            ("sda rbps=1", "MAJ:MIN"),
            ("8:0 ctrl=manual rbps=1", "ctrl=manual"),
            (
                "8:0 rbps=0 rseqiops=2 rrandiops=3 wbps=4 wseqiops=5 wrandiops=6",
                "rbps=0",
            ),
        ] {
            let e = line.parse::<ModelLine>().expect_err(line);
            assert!(e.contains(says), "{line}: {e}");
        }
        for (line, says) in [
            (
                "8:0 rpct=100.01 rlat=1 wpct=0 wlat=1 min=1 max=1",
                "rpct=100.01",
            ),
            ("8:0 rpct=0 rlat=1 wpct=0 wlat=1 min=60 max=50", "above max"),
            (
                "8:0 rpct=0 rlat=4294967296 wpct=0 wlat=1 min=1 max=1",
                "rlat",
            ),
            ("8:0 rpct=9x rlat=1 wpct=0 wlat=1 min=1 max=1", "rpct=9x"),
            // sscanf("%lld.") finds no whole part.
            ("8:0 rpct=.5 rlat=1 wpct=0 wlat=1 min=1 max=1", "rpct=.5"),
            ("8:0 rpct=0 rlat=1 wpct=0 wlat=1 min=1", "max missing"),
        ] {
            let e = line.parse::<QosLine>().expect_err(line);
            assert!(e.contains(says), "{line}: {e}");
        }
    }

    fn model_line() -> impl Strategy<Value = ModelLine> {
        (
            any::<u32>(),
            any::<u32>(),
            proptest::array::uniform6(1..=u64::MAX),
            any::<bool>(),
        )
            .prop_map(|(major, minor, v, user)| ModelLine {
                dev: DevNum { major, minor },
                ctrl: if user { Ctrl::User } else { Ctrl::Auto },
                params: ModelParams {
                    rbps: v[0],
                    rseqiops: v[1],
                    rrandiops: v[2],
                    wbps: v[3],
                    wseqiops: v[4],
                    wrandiops: v[5],
                },
            })
    }

    fn qos_line() -> impl Strategy<Value = QosLine> {
        (
            (any::<u32>(), any::<u32>(), any::<bool>()),
            (0..=10_000u32, any::<u32>(), 0..=10_000u32, any::<u32>()),
            (100..=1_000_000u32, 100..=1_000_000u32, any::<bool>()),
        )
            .prop_map(
                |((major, minor, enable), (rp, rl, wp, wl), (a, b, user))| QosLine {
                    dev: DevNum { major, minor },
                    enable,
                    ctrl: if user { Ctrl::User } else { Ctrl::Auto },
                    params: QosParams {
                        rpct: Centi(rp),
                        rlat: rl,
                        wpct: Centi(wp),
                        wlat: wl,
                        min: Centi(a.min(b)),
                        max: Centi(a.max(b)),
                    },
                },
            )
    }

    proptest! {
        #[test]
        fn model_lines_print_then_parse_back(m in model_line()) {
            let text = m.to_string();
            let back: ModelLine = text.parse().map_err(TestCaseError::fail)?;
            prop_assert_eq!(back, m);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn qos_lines_print_then_parse_back(q in qos_line()) {
            let text = q.to_string();
            let back: QosLine = text.parse().map_err(TestCaseError::fail)?;
            prop_assert_eq!(back, q);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn any_text_parses_or_is_refused_without_panic(s in "\\PC{0,80}") {
            let _ = s.parse::<ModelLine>();
            let _ = s.parse::<QosLine>();
        }
    }
}
