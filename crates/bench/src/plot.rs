//! PNG charts: lines against QD (log2 axis) and latency CDFs (log10 axis).

use std::path::Path;
use std::sync::OnceLock;

use plotters::chart::MeshStyle;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// One line on a chart.
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// Registers a TTF once: the ab_glyph backend has no system font lookup.
fn ensure_font() -> Result<(), String> {
    static FONT: OnceLock<Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let env = std::env::var("IOPACE_FONT").ok();
        let candidates = env.iter().map(String::as_str).chain(FONT_PATHS);
        for path in candidates {
            if let Ok(bytes) = std::fs::read(path) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err("no TTF font found: apt-get install fonts-dejavu-core (or set IOPACE_FONT)".into())
    })
    .clone()
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// A white PNG canvas with the title drawn; returns it and the area below
/// the title.
fn canvas<'a>(
    path: &'a Path,
    size: (u32, u32),
    title: &str,
) -> Result<(Area<'a>, Area<'a>), String> {
    ensure_font()?;
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let area = root
        .titled(title, ("sans-serif", title_size(title)))
        .map_err(err)?;
    Ok((root, area))
}

/// Long titles get a smaller font so they fit the 1000 px width.
fn title_size(title: &str) -> u32 {
    let len = title.chars().count().max(1) as u32;
    (1800 / len).clamp(14, 26)
}

/// The points a chart can place: finite, and with x above 0 on a log axis.
fn plottable(points: &[(f64, f64)], log_x: bool) -> impl Iterator<Item = (f64, f64)> + '_ {
    points
        .iter()
        .copied()
        .filter(move |(x, y)| x.is_finite() && y.is_finite() && (!log_x || *x > 0.0))
}

fn all_plottable(series: &[Series], log_x: bool) -> impl Iterator<Item = (f64, f64)> + '_ {
    series.iter().flat_map(move |s| plottable(&s.points, log_x))
}

/// Room for the axes' labels around a chart.
fn chart_builder<'a, 'b>(area: &'a Area<'b>) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.margin(20).x_label_area_size(55).y_label_area_size(80);
    b
}

/// The look every chart's axes share: label fonts, no light grid lines.
fn draw_mesh<X, Y>(mesh: &mut MeshStyle<'_, '_, X, Y, BitMapBackend<'_>>) -> Result<(), String>
where
    X: Ranged + ValueFormatter<X::ValueType>,
    Y: Ranged + ValueFormatter<Y::ValueType>,
{
    mesh.label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(err)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A line chart with markers, one line per series.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
) -> Result<(), String> {
    let (root, area) = canvas(path, (1000, 700), title)?;
    panel(
        &area,
        x_label,
        y_label,
        series,
        log_x,
        SeriesLabelPosition::LowerRight,
    )?;
    root.present().map_err(err)
}

/// Two line charts stacked in one PNG, sharing the x axis label.
pub fn two_panel_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    top: (&str, &[Series]),
    bottom: (&str, &[Series]),
    log_x: bool,
) -> Result<(), String> {
    let (root, area) = canvas(path, (1000, 1100), title)?;
    let (upper, lower) = area.split_vertically(area.dim_in_pixel().1 / 2);
    // Bandwidth tends to be high on the right, buffers low on the left.
    panel(
        &upper,
        x_label,
        top.0,
        top.1,
        log_x,
        SeriesLabelPosition::LowerRight,
    )?;
    panel(
        &lower,
        x_label,
        bottom.0,
        bottom.1,
        log_x,
        SeriesLabelPosition::UpperLeft,
    )?;
    root.present().map_err(err)
}

/// x is drawn at log2(x) when `log_x`; tick labels show the real values.
fn panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
    legend: SeriesLabelPosition,
) -> Result<(), String> {
    let tx = |x: f64| if log_x { x.max(1e-9).log2() } else { x };
    let pts: Vec<(f64, f64)> = all_plottable(series, log_x).collect();
    let (mut x0, mut x1) = pts
        .iter()
        .map(|p| tx(p.0))
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    if pts.is_empty() {
        (x0, x1) = (0.0, 1.0);
    }
    if (x1 - x0).abs() < 1e-9 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let pad = (x1 - x0) * 0.05;
    let y1 = pts.iter().map(|p| p.1).fold(0.0, f64::max);
    let y1 = if y1 > 0.0 { y1 * 1.1 } else { 1.0 };
    let mut chart = chart_builder(area)
        .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..y1)
        .map_err(err)?;
    let x_fmt = |v: &f64| {
        if log_x {
            let real = v.exp2();
            if (real - real.round()).abs() < 0.01 {
                format!("{}", real.round())
            } else {
                String::new()
            }
        } else {
            format_num(*v)
        }
    };
    let ticks = if log_x {
        ((x1 + pad).floor() - (x0 - pad).ceil()) as usize + 1
    } else {
        10
    };
    draw_mesh(
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_labels(ticks.clamp(2, 16))
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&|v| y_tick(*v, y1)),
    )?;
    let points = |s: &Series| -> Vec<(f64, f64)> {
        plottable(&s.points, log_x)
            .map(|(x, y)| (tx(x), y))
            .collect()
    };
    draw_series(&mut chart, series, &points, true, legend)
}

/// Y ticks with one precision per axis, chosen from its top.
fn y_tick(v: f64, top: f64) -> String {
    match top {
        t if t >= 20.0 => format!("{v:.0}"),
        t if t >= 2.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// 1, 2 and 5 times each power of ten inside [lo, hi]: round labels that
/// never crowd, however narrow the range.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut ticks = Vec::new();
    if !(lo > 0.0 && hi > lo && hi.is_finite()) {
        return ticks;
    }
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in [1.0, 2.0, 5.0] {
            let t = m * decade;
            if t >= lo && t <= hi {
                ticks.push(t);
            }
        }
        decade *= 10.0;
    }
    ticks
}

/// Lines (and markers) for every series, then the legend. Earlier series
/// are drawn wider, so identical curves stay visible.
fn draw_series<'a, X: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, RangedCoordf64>>,
    series: &[Series],
    points: &dyn Fn(&Series) -> Vec<(f64, f64)>,
    markers: bool,
    legend: SeriesLabelPosition,
) -> Result<(), String> {
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line = points(s);
        let width = 2 + (series.len() - i - 1).min(2) as u32;
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(width)))
            .map_err(err)?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        if markers {
            chart
                .draw_series(line.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(err)?;
        }
    }
    if !series.is_empty() {
        chart
            .configure_series_labels()
            .position(legend)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn format_num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.round() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A latency CDF: points are (latency_us, fraction 0..=1); x is log10.
pub fn cdf_chart(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let (root, area) = canvas(path, (1000, 700), title)?;
    let pts: Vec<(f64, f64)> = all_plottable(series, true).collect();
    let lo = pts.iter().map(|p| p.0).fold(f64::MAX, f64::min);
    let hi = pts.iter().map(|p| p.0).fold(0.0, f64::max);
    let (lo, hi) = if pts.is_empty() {
        (1.0, 10.0)
    } else {
        (lo / 1.5, hi * 1.5)
    };
    let mut chart = chart_builder(&area)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            0.0..1.02,
        )
        .map_err(err)?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_desc("Completion latency, us (log scale)")
            .y_desc("Fraction of IOs")
            .x_label_formatter(&|v| {
                if *v >= 1e4 {
                    format!("{}k", format_num(v / 1e3))
                } else {
                    format_num(*v)
                }
            })
            .y_label_formatter(&|v| format!("{v:.1}")),
    )?;
    let points = |s: &Series| -> Vec<(f64, f64)> { plottable(&s.points, true).collect() };
    draw_series(
        &mut chart,
        series,
        &points,
        false,
        SeriesLabelPosition::LowerRight,
    )?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Series> {
        let qds = [8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
        vec![
            Series {
                label: "iopace mode=none".into(),
                points: qds.iter().map(|&q| (q, 1.9)).collect(),
            },
            Series {
                label: "iopace mode=auto".into(),
                points: qds.iter().map(|&q| (q, (q / 64.0).min(1.9))).collect(),
            },
        ]
    }

    fn big_png(path: &Path) {
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        assert!(len > 5000, "{} is {len} bytes", path.display());
    }

    #[test]
    fn log_ticks_are_round() {
        assert_eq!(log_ticks(95e3, 780e3), [100e3, 200e3, 500e3]);
        assert_eq!(log_ticks(3.0, 30.0), [5.0, 10.0, 20.0]);
        assert!(log_ticks(0.0, 1.0).is_empty());
    }

    #[test]
    fn charts_render() {
        if ensure_font().is_err() {
            eprintln!("no font installed; skipping");
            return;
        }
        let dir = std::env::var("IOPACE_PLOT_SAMPLES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| std::env::temp_dir());
        let _ = std::fs::create_dir_all(&dir);
        let tmp = tempfile::tempdir_in(&dir).expect("dir");
        let keep = std::env::var("IOPACE_PLOT_SAMPLES").is_ok();
        let base = if keep {
            dir.clone()
        } else {
            tmp.path().to_path_buf()
        };
        let s = sample();
        let p = base.join("line.png");
        line_chart(&p, "line", "Total queue depth (QD)", "BW, Gb/s", &s, true).expect("line");
        big_png(&p);
        let p = base.join("two.png");
        two_panel_chart(&p, "two", "QD", ("BW, Gb/s", &s), ("Bufs, MiB", &s), true).expect("two");
        big_png(&p);
        let cdf = vec![
            Series {
                label: "none".into(),
                points: vec![(150e3, 0.1), (290e3, 0.8), (500e3, 0.99), (520e3, 1.0)],
            },
            Series {
                label: "auto".into(),
                points: vec![(150e3, 0.1), (290e3, 0.8), (500e3, 0.99), (520e3, 1.0)],
            },
        ];
        let p = base.join("cdf.png");
        cdf_chart(&p, "cdf", &cdf).expect("cdf");
        big_png(&p);
        // Empty and degenerate input draw empty charts rather than failing.
        let one = vec![Series {
            label: "one".into(),
            points: vec![(8.0, f64::NAN), (8.0, 1.0)],
        }];
        line_chart(&base.join("one.png"), "one", "x", "y", &one, true).expect("one point");
        line_chart(&base.join("none.png"), "none", "x", "y", &[], false).expect("empty");
    }
}
