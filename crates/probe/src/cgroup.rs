//! Where iocost's lines go: the device number a line names (a whole
//! disk's, from sysfs) and writing the lines into the root of a cgroup2
//! hierarchy, whose `io.cost.model` and `io.cost.qos` are iocost's
//! configuration. The kernel offers those files only in the root cgroup of
//! cgroup2, and only while the io controller is not bound to cgroup v1.

use std::io::Write as _;
use std::path::Path;

use crate::iocost::{DevNum, ModelLine, QosLine};

/// The number a device's lines name, and how it was found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LineDev {
    pub dev: DevNum,
    /// For the report: where the number came from, or why it is a placeholder.
    pub how: String,
}

impl LineDev {
    pub fn placeholder(why: String) -> LineDev {
        LineDev {
            dev: DevNum::PLACEHOLDER,
            how: why,
        }
    }

    /// Given on the command line.
    pub fn given(dev: DevNum) -> LineDev {
        LineDev {
            dev,
            how: "given with --devnum".into(),
        }
    }
}

/// The `dev` file of a sysfs block directory: `MAJ:MIN`.
fn sysfs_dev(dir: &Path) -> Option<DevNum> {
    std::fs::read_to_string(dir.join("dev"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The whole disk holding block device `dev`, from sysfs (a partition's
/// directory sits inside its disk's); none without sysfs.
fn whole_disk(dev: DevNum) -> Option<DevNum> {
    let disk = bdev::identity::sysfs_disk(dev.major, dev.minor)?;
    sysfs_dev(&disk)
}

/// The number of the disk a path's lines are for: a block device's own
/// (its whole disk's, for a partition: iocost configures whole disks), or
/// the disk under a file's filesystem; a placeholder where there is none.
pub fn of_path(path: &Path) -> LineDev {
    let (major, minor, is_block) = match bdev::identity::device_numbers(path) {
        Ok(n) => n,
        Err(e) => return LineDev::placeholder(format!("{}: {e}", path.display())),
    };
    let dev = DevNum { major, minor };
    let disk = whole_disk(dev);
    let (dev, how) = match (is_block, disk) {
        (true, Some(d)) if d == dev => (d, "the block device's own (sysfs)".to_string()),
        (true, Some(d)) => (d, format!("the whole disk of partition {dev} (sysfs): iocost configures whole disks")),
        (true, None) => (dev, "the block device's own (stat; not in sysfs)".to_string()),
        (false, Some(d)) => (
            d,
            format!("the disk under the file's filesystem (device {dev}, sysfs): the parameters are that disk's as seen through the file"),
        ),
        (false, None) => {
            return LineDev::placeholder(format!(
                "{} is a file on device {dev}, which is no block device (tmpfs, overlay, a network or anonymous filesystem): 0:0 is a placeholder; give --devnum MAJ:MIN",
                path.display()
            ))
        }
    };
    LineDev { dev, how }
}

/// A bdev of a config that is not over a file: no kernel block device.
pub fn of_bdev(name: &str, kind: &str) -> LineDev {
    LineDev::placeholder(format!(
        "`{name}` is a {kind} bdev, not a kernel block device: 0:0 is a placeholder; give --devnum MAJ:MIN for the disk these parameters describe"
    ))
}

/// Why `dir` offers no `file`: not a cgroup2 root, iocost not built, or the
/// io controller on cgroup v1 (`/proc/cgroups` names blkio's hierarchy).
fn why_not_offered(dir: &Path, file: &str, proc_cgroups: &str) -> String {
    let v1 = proc_cgroups.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 4 && f[0] == "blkio" && f[1] != "0" && f[3] == "1").then(|| f[1].to_string())
    });
    let base = format!("{} has no {file}", dir.display());
    let why = if !dir.is_dir() {
        format!("{}: no such directory", dir.display())
    } else if !dir.join("cgroup.controllers").exists() {
        format!("{base}: it is not a cgroup2 hierarchy (no cgroup.controllers)")
    } else if !dir.join("cgroup.procs").exists() || dir.join("cgroup.events").exists() {
        format!("{base}: iocost's files are only in the root cgroup of a cgroup2 hierarchy")
    } else {
        format!("{base}: the kernel has no iocost (CONFIG_BLK_CGROUP_IOCOST), or the io controller is not on this hierarchy")
    };
    match v1 {
        Some(h) => format!(
            "{why}. This machine's io controller (blkio) is bound to cgroup v1 (hierarchy {h} in /proc/cgroups); iocost needs it on cgroup2 (boot with systemd.unified_cgroup_hierarchy=1, or cgroup_no_v1=blkio)"
        ),
        None => why,
    }
}

/// One line to write into a cgroup2 root's iocost file.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    Model(ModelLine),
    Qos(QosLine),
}

impl Line {
    pub fn file(&self) -> &'static str {
        match self {
            Line::Model(_) => "io.cost.model",
            Line::Qos(_) => "io.cost.qos",
        }
    }

    fn dev(&self) -> DevNum {
        match self {
            Line::Model(m) => m.dev,
            Line::Qos(q) => q.dev,
        }
    }

    fn text(&self) -> String {
        match self {
            Line::Model(m) => m.to_string(),
            Line::Qos(q) => q.to_string(),
        }
    }

    /// The file's line for our device, as the kernel reads it back, is ours.
    fn read_back(&self, file_text: &str) -> Option<String> {
        let mine = file_text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(self.dev().to_string().as_str()))?;
        let same = match self {
            Line::Model(m) => mine
                .parse::<ModelLine>()
                .is_ok_and(|b| b.params == m.params),
            Line::Qos(q) => mine
                .parse::<QosLine>()
                .is_ok_and(|b| b.params == q.params && b.enable == q.enable),
        };
        same.then(|| mine.to_string())
    }
}

/// Writes `lines` into the cgroup2 root `dir` in order (the model first,
/// so the controller enabled by the QoS line starts with it), each read
/// back; returns what was written, or says why not and writes nothing more.
pub fn apply(dir: &Path, lines: &[Line]) -> Result<Vec<String>, String> {
    let proc_cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    let mut done = Vec::new();
    for line in lines {
        if line.dev().is_placeholder() {
            return Err(format!(
                "not applied: `{}` names the placeholder device 0:0; give --devnum MAJ:MIN",
                line.text()
            ));
        }
        let path = dir.join(line.file());
        if !path.is_file() {
            return Err(format!(
                "not applied: {}",
                why_not_offered(dir, line.file(), &proc_cgroups)
            ));
        }
        let text = line.text();
        // One write of the whole line: the kernel parses each write alone.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()))
            .map_err(|e| {
                format!(
                    "not applied: the kernel refused `{text}` in {}: {e}",
                    path.display()
                )
            })?;
        let back = std::fs::read_to_string(&path).unwrap_or_default();
        match line.read_back(&back) {
            Some(b) => done.push(format!("{}: {b}", path.display())),
            None => {
                return Err(format!(
                    "{}: wrote `{text}`, but the file reads back no such line for {}",
                    path.display(),
                    line.dev()
                ))
            }
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iocost::{Centi, Ctrl, ModelParams, QosParams};

    fn model(dev: DevNum) -> Line {
        Line::Model(ModelLine {
            dev,
            ctrl: Ctrl::User,
            params: ModelParams::of(&pace::pacer::CostModel::nvme()),
        })
    }

    fn qos(dev: DevNum) -> Line {
        Line::Qos(QosLine {
            dev,
            enable: true,
            ctrl: Ctrl::User,
            params: QosParams {
                rpct: Centi(0),
                rlat: 250,
                wpct: Centi(0),
                wlat: 250,
                min: Centi(6000),
                max: Centi(6000),
            },
        })
    }

    /// A directory standing in for a cgroup2 root with iocost.
    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in [
            "cgroup.controllers",
            "cgroup.procs",
            "io.cost.model",
            "io.cost.qos",
        ] {
            std::fs::write(dir.path().join(f), "").expect("stand-in file");
        }
        dir
    }

    #[test]
    fn both_lines_are_written_and_read_back() {
        let dir = root();
        let dev = DevNum {
            major: 259,
            minor: 0,
        };
        let done = apply(dir.path(), &[model(dev), qos(dev)]).expect("applied");
        assert_eq!(done.len(), 2);
        let m = std::fs::read_to_string(dir.path().join("io.cost.model")).expect("model");
        assert!(m.starts_with("259:0 ctrl=user model=linear rbps="), "{m}");
        let q = std::fs::read_to_string(dir.path().join("io.cost.qos")).expect("qos");
        assert_eq!(
            q,
            "259:0 enable=1 ctrl=user rpct=0.00 rlat=250 wpct=0.00 wlat=250 min=60.00 max=60.00\n"
        );
    }

    #[test]
    fn what_the_kernel_does_not_offer_is_said() {
        let dev = DevNum { major: 8, minor: 0 };
        let dir = tempfile::tempdir().expect("tempdir");
        let e = apply(dir.path(), &[model(dev)]).expect_err("no cgroup2");
        assert!(e.contains("not a cgroup2 hierarchy"), "{e}");
        let dir = root();
        std::fs::remove_file(dir.path().join("io.cost.qos")).expect("rm");
        let e = apply(dir.path(), &[qos(dev)]).expect_err("no iocost");
        assert!(
            e.contains("has no io.cost.qos") && e.contains("CONFIG_BLK_CGROUP_IOCOST"),
            "{e}"
        );
        let e = apply(&dir.path().join("nope"), &[qos(dev)]).expect_err("no dir");
        assert!(e.contains("no such directory"), "{e}");
        let e = apply(root().path(), &[model(DevNum::PLACEHOLDER)]).expect_err("placeholder");
        assert!(e.contains("placeholder") && e.contains("--devnum"), "{e}");
        // A child cgroup has cgroup.events; only the root offers iocost.
        let child = root();
        std::fs::write(child.path().join("cgroup.events"), "").expect("events");
        std::fs::remove_file(child.path().join("io.cost.model")).expect("rm");
        let e = apply(child.path(), &[model(dev)]).expect_err("child");
        assert!(e.contains("only in the root cgroup"), "{e}");
        // cgroup v1's blkio, as on this machine.
        let v1 = "#subsys_name\thierarchy\tnum_cgroups\tenabled\nblkio\t7\t1\t1\n";
        let why = why_not_offered(dir.path(), "io.cost.model", v1);
        assert!(why.contains("bound to cgroup v1 (hierarchy 7"), "{why}");
        // The temporary directory's random name may itself contain "v1".
        let unbound = why_not_offered(dir.path(), "x", "blkio\t0\t1\t1\n");
        assert!(!unbound.contains("bound to cgroup v1"), "{unbound}");
    }

    #[test]
    fn a_read_back_that_differs_is_an_error() {
        let dev = DevNum {
            major: 8,
            minor: 16,
        };
        let Line::Model(m) = model(dev) else {
            unreachable!()
        };
        let other = ModelLine {
            params: ModelParams {
                rbps: 1,
                ..m.params
            },
            ..m
        };
        assert!(model(dev).read_back(&format!("8:0 x\n{other}\n")).is_none());
        assert!(model(dev).read_back(&format!("8:0 x\n{m}\n")).is_some());
    }

    #[test]
    fn a_file_names_the_disk_under_it_or_a_placeholder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("img");
        std::fs::write(&f, b"x").expect("file");
        let d = of_path(&f);
        // Either a disk from sysfs, or a placeholder that says why.
        assert!(
            d.dev.is_placeholder() == d.how.contains("placeholder"),
            "{d:?}"
        );
        let missing = of_path(&dir.path().join("nope"));
        assert!(missing.dev.is_placeholder(), "{missing:?}");
        assert!(of_bdev("m", "model")
            .how
            .contains("not a kernel block device"));
    }
}
