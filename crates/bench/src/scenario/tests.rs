use super::*;

const MIN: &str = r#"
[test]
name = "t1"
title = "A test"
[[target]]
name = "iopace"
kind = "iopace"
config = "mode = \"{{mode}}\""
[[target]]
name = "nbdkit"
kind = "nbdkit"
args = ["memory", "1G"]
[workload]
bs = "128k"
[sweep]
qd = [8, 32]
mode = ["none", "auto"]
"#;

fn parse(text: &str) -> Result<Loaded, ConfigError> {
    Loaded::parse(text, Path::new("s.toml"))
}

#[test]
fn points_are_the_cartesian_product() {
    let l = parse(MIN).expect("valid");
    let pts = l.scenario.points();
    assert_eq!(pts.len(), 4);
    let qds: Vec<_> = pts.iter().map(|p| p.vars["qd"].as_str()).collect();
    let modes: Vec<_> = pts.iter().map(|p| p.vars["mode"].as_str()).collect();
    assert_eq!(modes, ["none", "none", "auto", "auto"]);
    assert_eq!(qds, ["8", "32", "8", "32"]);
    assert_eq!(l.scenario.x_var(), Some("qd"));
}

#[test]
fn series_at_one_x_run_back_to_back_in_rotating_order() {
    let l = parse(MIN).expect("valid");
    let pts = l.scenario.points();
    let runs = l.scenario.runs(&pts);
    let order: Vec<_> = runs
        .iter()
        .step_by(2) // one run per point: two targets each
        .map(|r| {
            let v = &pts[r.point].vars;
            format!("{}@{}", v["mode"], v["qd"])
        })
        .collect();
    assert_eq!(order, ["none@8", "auto@8", "auto@32", "none@32"]);
    let mut fixed = parse(MIN).expect("valid");
    fixed.scenario.run.alternate = false;
    let runs = fixed.scenario.runs(&pts);
    let first: Vec<_> = runs.iter().step_by(2).map(|r| r.point).collect();
    assert_eq!(first, [0, 2, 1, 3], "grouped by qd, not rotated");
}

#[test]
fn runs_alternate_target_order() {
    let mut l = parse(MIN).expect("valid");
    l.scenario.run.repeat = 2;
    let pts = l.scenario.points();
    let runs = l.scenario.runs(&pts[..1]);
    let order: Vec<_> = runs.iter().map(|r| (r.target, r.rep)).collect();
    assert_eq!(order, [(0, 0), (1, 0), (1, 1), (0, 1)]);
}

#[test]
fn total_qd_is_divided_over_jobs() {
    let l = parse(MIN).expect("valid");
    let p = &l.scenario.points()[1];
    let mut w = l.scenario.workload_at(p);
    w.exports = vec!["a".into(), "b".into()];
    assert_eq!(w.job_iodepth(2), 8);
    assert_eq!(w.total_qd(2), 32);
    w.iodepth_of.insert("b".into(), 1);
    assert_eq!(w.total_qd(2), 18, "2 hosts x (8 + 1)");
    w.iodepth_of.clear();
    w.qd = Some(1);
    assert_eq!(w.job_iodepth(2), 1, "never below one");
}

#[test]
fn render_fills_and_names_missing() {
    let vars = BTreeMap::from([("mode".to_string(), "auto".to_string())]);
    assert_eq!(render("m = {{ mode }};", &vars).expect("ok"), "m = auto;");
    let e = render("{{nope}}", &vars).expect_err("missing");
    assert!(e.contains("nope"), "{e}");
    assert!(render("{{mode", &vars).is_err());
    let mut vars = vars;
    vars.insert("t_auto".into(), "x = {{mode}}".into());
    assert_eq!(
        render("{{t_{{mode}}}}!", &vars).expect("nested"),
        "x = auto!"
    );
    vars.insert("loop".into(), "{{loop}}".into());
    assert!(render("{{loop}}", &vars).is_err());
    let toml = "a = { b = { c = 1 }}\nm = \"{{mode}}\"";
    assert_eq!(
        render(toml, &vars).expect("inline tables"),
        "a = { b = { c = 1 }}\nm = \"auto\""
    );
}

#[test]
fn errors_name_line_and_field() {
    let bad = MIN.replace("kind = \"nbdkit\"", "kind = \"nbdkit\"\nconfig = \"x\"");
    let e = parse(&bad).expect_err("peer with config");
    assert_eq!(e.field.as_deref(), Some("target.config"));
    assert_eq!(e.line, Some(12));
    let e = parse(&MIN.replace("bs = \"128k\"", "bs = \"128k\"\nbogus = 1")).expect_err("unknown");
    assert_eq!(e.field.as_deref(), Some("bogus"));
    assert!(e.line.is_some());
    let e = parse(&MIN.replace("qd = [8, 32]", "qd = [0]")).expect_err("qd 0");
    assert_eq!(e.field.as_deref(), Some("sweep.qd"));
}

#[test]
fn quick_replaces_sweeps_and_shortens() {
    let text = format!("{MIN}\n[quick]\nruntime = 2\n[quick.sweep]\nqd = [16]\n");
    let mut l = parse(&text).expect("valid");
    l.make_quick();
    assert_eq!(l.scenario.workload.runtime, 2);
    assert_eq!(l.scenario.points().len(), 2);
}

#[test]
fn hosts_take_one_rate_each() {
    let base = "[test]\nname = \"t\"\ntitle = \"t\"\n[[target]]\nname = \"i\"\nkind = \"iopace\"\n[workload]\nbs = \"128k\"\n";
    let l = parse(&format!(
        "{base}[hosts]\nkind = \"netns\"\ncount = 3\nrate = [\"1gbit\", \"500mbit\", \"250mbit\"]\ndelay = \"50us\"\n"
    ))
    .expect("valid");
    let wires = l.scenario.wire_at(&l.scenario.points()[0]);
    let rates: Vec<Option<f64>> = wires.iter().map(HostWire::rate_gbps).collect();
    assert_eq!(rates, vec![Some(1.0), Some(0.5), Some(0.25)]);
    assert!(wires.iter().all(|w| w.delay.as_deref() == Some("50us")));
    let short = parse(&format!(
        "{base}[hosts]\nkind = \"netns\"\ncount = 3\nrate = [\"1gbit\", \"250mbit\"]\n"
    ))
    .expect_err("two rates for three hosts");
    assert_eq!(short.field.as_deref(), Some("hosts.rate"));
    let bad = parse(&format!(
        "{base}[hosts]\nkind = \"netns\"\nrate = \"fast\"\n"
    ))
    .expect_err("not a rate");
    assert!(bad.message.contains("fast"), "{}", bad.message);
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_size("1GiB"), Some(1 << 30));
    assert_eq!(parse_size("512m"), Some(512 << 20));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("1x"), None);
}

#[test]
fn a_target_is_told_its_port_capacity_or_the_shaped_rate() {
    let base = "[test]\nname = \"t\"\ntitle = \"t\"\n[workload]\nbs = \"128k\"\n\
                [hosts]\nkind = \"netns\"\ncount = 2\nrate = \"1gbit\"\n";
    let targets = "[[target]]\nname = \"known\"\nkind = \"iopace\"\nport_gbps = \"wire\"\n\
                   [[target]]\nname = \"fixed\"\nkind = \"iopace\"\nport_gbps = 25\n\
                   [[target]]\nname = \"unknown\"\nkind = \"iopace\"\n";
    let l = parse(&format!(
        "{base}{targets}[sweep]\nport_rate = [\"2gbit\", \"500mbit\"]\n"
    ))
    .expect("valid");
    let s = &l.scenario;
    assert!(port_shaped(s));
    let told = |p: &Point| -> Vec<Option<f64>> {
        s.target.iter().map(|t| port_gbps_at(s, t, p)).collect()
    };
    let pts = s.points();
    assert_eq!(told(&pts[0]), [Some(2.0), Some(25.0), None]);
    assert_eq!(told(&pts[1]), [Some(0.5), Some(25.0), None]);
    assert_eq!(port_rate_at(s, &pts[1]).as_deref(), Some("500mbit"));
    // `[hosts] port_rate` stands when it is not swept.
    let fixed = parse(&format!("{base}port_rate = \"1500mbit\"\n{targets}")).expect("valid");
    let p = &fixed.scenario.points()[0];
    assert_eq!(
        port_gbps_at(&fixed.scenario, &fixed.scenario.target[0], p),
        Some(1.5)
    );
}

#[test]
fn port_settings_are_checked_with_line_and_field() {
    let base = "[test]\nname = \"t\"\ntitle = \"t\"\n[workload]\nbs = \"128k\"\n";
    let netns = "[hosts]\nkind = \"netns\"\n";
    let iopace = "[[target]]\nname = \"i\"\nkind = \"iopace\"\n";
    let cases = [
        // "wire" with no shaped port to take it from.
        (
            format!("{base}{netns}{iopace}port_gbps = \"wire\"\n"),
            "target.port_gbps",
            "port_rate",
        ),
        (
            format!("{base}{netns}{iopace}port_gbps = \"fast\"\n"),
            "target.port_gbps",
            "fast",
        ),
        (
            format!("{base}{netns}{iopace}port_gbps = 0\n"),
            "target.port_gbps",
            "above 0",
        ),
        (
            format!("{base}{netns}[[target]]\nname = \"p\"\nkind = \"nbdkit\"\nport_gbps = 1\n"),
            "target.port_gbps",
            "only iopace",
        ),
        (
            format!("{base}{netns}port_rate = \"quick\"\n{iopace}"),
            "hosts.port_rate",
            "quick",
        ),
        (
            format!("{base}[hosts]\nport_rate = \"1gbit\"\n{iopace}"),
            "hosts.port_rate",
            "netns",
        ),
        (
            format!("{base}{netns}{iopace}[sweep]\nport_rate = [\"1gbit\", \"x\"]\n"),
            "sweep.port_rate",
            "tc rates",
        ),
    ];
    for (text, field, says) in cases {
        let e = parse(&text).expect_err(&text);
        assert_eq!(e.field.as_deref(), Some(field), "{text}");
        assert!(e.line.is_some(), "{text}");
        assert!(e.message.contains(says), "{}: {text}", e.message);
    }
}

#[test]
fn hosts_with_an_export_each_run_only_theirs() {
    let base = "[test]\nname = \"t\"\ntitle = \"t\"\n[[target]]\nname = \"i\"\nkind = \"iopace\"\n\
                [workload]\nbs = \"128k\"\nexports = [\"gold\", \"bronze\"]\nqd = 96\n";
    let l = parse(&format!(
        "{base}[hosts]\ncount = 3\nexport = [\"gold\", \"bronze\", \"bronze\"]\n"
    ))
    .expect("valid");
    let works = l.scenario.host_workloads(&l.scenario.points()[0]);
    let exports: Vec<&str> = works.iter().map(|w| w.exports[0].as_str()).collect();
    assert_eq!(exports, ["gold", "bronze", "bronze"]);
    assert!(works.iter().all(|w| w.exports.len() == 1));
    // QD 96 over three hosts of one job each: 32 each, 96 in all.
    assert_eq!(works[0].job_iodepth(3), 32);
    assert_eq!(works.iter().map(|w| w.host_qd(3)).sum::<u32>(), 96);
    let e = parse(&format!(
        "{base}[hosts]\ncount = 2\nexport = [\"gold\", \"silver\"]\n"
    ))
    .expect_err("not a workload export");
    assert_eq!(e.field.as_deref(), Some("hosts.export"));
    assert!(e.message.contains("silver"), "{}", e.message);
}

#[test]
fn every_scenario_in_the_library_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("scenarios/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "toml") {
            Loaded::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n > 30, "{n} scenarios in {}", dir.display());
}
