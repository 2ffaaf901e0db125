//! Turning samples into results: medians and spread per workload phase and
//! target, each target's time relative to uext4's measured pair by pair, a
//! markdown table per workload, JSON with every sample, and a PNG per workload.

use crate::target::{DeviceSnapshot, Target};
use crate::BenchError;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use uext4::dev::IoClass;

/// One timed phase of one run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    pub workload: String,
    pub phase: String,
    pub target: Target,
    /// Which repetition; runs of all targets in one repetition form a pair with uext4's.
    pub run: usize,
    /// Threads the phase ran its operations on.
    pub threads: u64,
    pub ops: u64,
    pub wall_s: f64,
    pub ops_per_s: f64,
    /// This process plus a FUSE daemon, user and system.
    pub cpu_s: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// The device during the phase: uext4's device layer, or the kernel's loop
    /// device (its /sys/block counters; by class from its block tracepoint).
    pub device: Option<DeviceFigures>,
    /// The phase's requests priced by uext4's disk models (`uext4::dev::io_model`).
    pub model: Option<ModelFigures>,
    /// The 99th percentile of the phase's operation latencies, in milliseconds,
    /// for workloads that time each operation (`Phases::timed_latencies`).
    pub latency_p99_ms: Option<f64>,
    /// Lines of debugfs `ex` for the phase's file after the run (seed 001's count),
    /// for workloads that name one.
    pub extents: Option<u64>,
    /// Bytes in use on the image after the run, for the workload's space phase
    /// (`Workload::space_phase`): (block count - free blocks) x block size.
    pub used_bytes: Option<u64>,
    /// The same on the fresh image, before the run.
    pub fresh_used_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DeviceFigures {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    /// Requests and blocks by what the blocks hold (empty without a model).
    pub by_class: BTreeMap<&'static str, ClassFigures>,
    /// Distinct inode-table blocks written during the phase.
    pub itable_blocks_written: u64,
    /// Inode-table blocks written, counting every write of each.
    pub itable_block_writes: u64,
}

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ClassFigures {
    pub reads: u64,
    pub read_blocks: u64,
    pub writes: u64,
    pub write_blocks: u64,
    /// Modelled rotating-disk seconds of this class's requests.
    pub hdd_s: f64,
}

/// Seconds the phase's requests would take on the model disks.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ModelFigures {
    /// The seeds' 7200 rpm SATA disk.
    pub hdd_s: f64,
    /// A SATA SSD.
    pub ssd_s: f64,
    pub requests: u64,
}

impl DeviceFigures {
    /// The figures of a phase, from the snapshots around it.
    pub fn between(before: &DeviceSnapshot, after: &DeviceSnapshot) -> (Option<DeviceFigures>, Option<ModelFigures>) {
        let model = after.model.zip(before.model).map(|(a, b)| a.since(&b));
        let stats = after.stats.zip(before.stats).map(|(a, b)| a - b);
        let mut figures = match (stats, &model) {
            (Some(s), _) => DeviceFigures {
                reads: s.reads,
                read_bytes: s.read_bytes,
                writes: s.writes,
                write_bytes: s.write_bytes,
                flushes: s.flushes,
                ..Default::default()
            },
            (None, Some(m)) => DeviceFigures {
                reads: m.reads,
                read_bytes: m.read_bytes,
                writes: m.writes,
                write_bytes: m.write_bytes,
                flushes: m.flushes,
                ..Default::default()
            },
            (None, None) => return (None, None),
        };
        if let Some(m) = &model {
            for class in IoClass::ALL {
                let c = m.class(class);
                if c.reads + c.writes + c.read_blocks + c.write_blocks > 0 {
                    figures.by_class.insert(
                        class.name(),
                        ClassFigures {
                            reads: c.reads,
                            read_blocks: c.read_blocks,
                            writes: c.writes,
                            write_blocks: c.write_blocks,
                            hdd_s: m.class_hdd_s(class),
                        },
                    );
                }
            }
            figures.itable_blocks_written = m.itable_blocks_written;
            figures.itable_block_writes = m.itable_block_writes;
        }
        let model = model.map(|m| ModelFigures { hdd_s: m.hdd_s, ssd_s: m.ssd_s, requests: m.requests });
        (Some(figures), model)
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Skipped {
    pub target: Target,
    pub reason: String,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkloadInfo {
    pub name: String,
    pub about: String,
    pub size: String,
    pub image_mb: u64,
}

#[derive(Debug, serde::Serialize)]
pub struct Results {
    pub command: String,
    pub machine: String,
    /// /proc/loadavg (1, 5, 15 minutes) when the run started and when it ended.
    pub load_average: Vec<String>,
    pub quick: bool,
    pub runs: usize,
    pub mkfs: String,
    pub targets: Vec<Target>,
    pub skipped: Vec<Skipped>,
    pub workloads: Vec<WorkloadInfo>,
    pub samples: Vec<Sample>,
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Figures of one target in one phase.
pub struct Summary {
    pub target: Target,
    pub wall: Vec<f64>,
    pub median_wall: f64,
    pub median_ops_per_s: f64,
    pub median_cpu: f64,
    pub median_voluntary: f64,
    /// Median over runs of (this target's time / uext4's time in the same run).
    pub ratio_to_uext4: Option<f64>,
    pub device: Option<DeviceFigures>,
    /// Medians of the model figures.
    pub model: Option<ModelFigures>,
    /// Median over rounds of this target's modelled HDD time over uext4's.
    pub hdd_ratio_to_uext4: Option<f64>,
    /// Median over runs of the phase's 99th-percentile operation latency.
    pub median_p99_ms: Option<f64>,
    /// Median over runs of this phase's ops/s over the workload's first
    /// phase's ops/s in the same run (for fsync-storm: the create rate kept
    /// with N fsyncers, against none).
    pub rate_kept: Option<f64>,
}

impl Results {
    /// Phases of a workload in the order they ran.
    pub fn phases(&self, workload: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.samples.iter().filter(|s| s.workload == workload) {
            if !out.contains(&s.phase) {
                out.push(s.phase.clone());
            }
        }
        out
    }

    /// The median over rounds of `target`'s time divided by `base`'s in the same
    /// round (None unless both ran).
    pub fn round_ratio(&self, workload: &str, phase: &str, target: &Target, base: &Target) -> Option<f64> {
        self.round_ratio_of(workload, phase, target, base, &|s| Some(s.wall_s))
    }

    /// The same for any figure of a sample.
    pub fn round_ratio_of(
        &self,
        workload: &str,
        phase: &str,
        target: &Target,
        base: &Target,
        figure: &dyn Fn(&Sample) -> Option<f64>,
    ) -> Option<f64> {
        let of = |t: &Target| {
            let t = t.clone();
            self.samples.iter().filter(move |s| s.workload == workload && s.phase == phase && s.target == t)
        };
        let mut ratios: Vec<f64> = of(target)
            .filter_map(|s| {
                let b = of(base).find(|b| b.run == s.run)?;
                Some(figure(s)? / figure(b)?).filter(|r| r.is_finite())
            })
            .collect();
        (!ratios.is_empty()).then(|| median(&mut ratios))
    }

    /// What journaling costs each target that ran both ways: time with the
    /// journal over time without it.
    pub fn journal_costs(&self, workload: &str, phase: &str) -> Vec<(Target, f64)> {
        self.targets
            .iter()
            .filter(|t| !t.has_journal())
            .filter_map(|bare| {
                self.round_ratio(workload, phase, &bare.with_journal(), bare).map(|r| (bare.with_journal(), r))
            })
            .collect()
    }

    /// The median over runs of `target`'s ops/s in `phase` over its ops/s in
    /// the workload's first phase of the same run (None for the first phase).
    pub fn rate_kept(&self, workload: &str, phase: &str, target: &Target) -> Option<f64> {
        let phases = self.phases(workload);
        let first = phases.first().filter(|first| *first != phase)?;
        let of = |p: &str| -> Vec<&Sample> {
            self.samples.iter().filter(|s| s.workload == workload && s.phase == p && &s.target == target).collect()
        };
        let bases = of(first);
        let mut kept: Vec<f64> = of(phase)
            .into_iter()
            .filter_map(|s| {
                let base = bases.iter().find(|b| b.run == s.run)?;
                Some(s.ops_per_s / base.ops_per_s).filter(|r| r.is_finite())
            })
            .collect();
        (!kept.is_empty()).then(|| median(&mut kept))
    }

    pub fn summarize(&self, workload: &str, phase: &str) -> Vec<Summary> {
        let of = |t: &Target| -> Vec<&Sample> {
            self.samples.iter().filter(|s| s.workload == workload && s.phase == phase && &s.target == t).collect()
        };
        let base = self.targets.iter().find(|t| t.is_base()).cloned();
        let mut out = Vec::new();
        for target in &self.targets {
            let samples = of(target);
            if samples.is_empty() {
                continue;
            }
            let pick = |f: &dyn Fn(&Sample) -> f64| median(&mut samples.iter().map(|s| f(s)).collect::<Vec<_>>());
            let device = samples.iter().filter_map(|s| s.device.as_ref()).collect::<Vec<_>>();
            let device_median = (!device.is_empty()).then(|| {
                let m = |f: &dyn Fn(&DeviceFigures) -> u64| {
                    median(&mut device.iter().map(|d| f(d) as f64).collect::<Vec<_>>()) as u64
                };
                DeviceFigures {
                    reads: m(&|d| d.reads),
                    read_bytes: m(&|d| d.read_bytes),
                    writes: m(&|d| d.writes),
                    write_bytes: m(&|d| d.write_bytes),
                    flushes: m(&|d| d.flushes),
                    by_class: BTreeMap::new(),
                    itable_blocks_written: m(&|d| d.itable_blocks_written),
                    itable_block_writes: m(&|d| d.itable_block_writes),
                }
            });
            let models = samples.iter().filter_map(|s| s.model).collect::<Vec<_>>();
            let model_median = (!models.is_empty()).then(|| {
                let m = |f: &dyn Fn(&ModelFigures) -> f64| median(&mut models.iter().map(f).collect::<Vec<_>>());
                ModelFigures {
                    hdd_s: m(&|d| d.hdd_s),
                    ssd_s: m(&|d| d.ssd_s),
                    requests: m(&|d| d.requests as f64) as u64,
                }
            });
            let ratio = |figure: &dyn Fn(&Sample) -> Option<f64>| {
                base.as_ref().and_then(|b| self.round_ratio_of(workload, phase, target, b, figure))
            };
            out.push(Summary {
                target: target.clone(),
                wall: samples.iter().map(|s| s.wall_s).collect(),
                median_wall: pick(&|s| s.wall_s),
                median_ops_per_s: pick(&|s| s.ops_per_s),
                median_cpu: pick(&|s| s.cpu_s),
                median_voluntary: pick(&|s| s.voluntary_switches as f64),
                ratio_to_uext4: ratio(&|s| Some(s.wall_s)),
                device: device_median,
                model: model_median,
                hdd_ratio_to_uext4: ratio(&|s| s.model.map(|m| m.hdd_s)),
                median_p99_ms: {
                    let mut p99: Vec<f64> = samples.iter().filter_map(|s| s.latency_p99_ms).collect();
                    (!p99.is_empty()).then(|| median(&mut p99))
                },
                rate_kept: self.rate_kept(workload, phase, target),
            });
        }
        out
    }

    /// Per target, the median of the extent counts of `phase` (none when no run counted).
    fn median_extents(&self, workload: &str, phase: &str) -> Vec<(String, u64)> {
        let mut by_target: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for s in self.samples.iter().filter(|s| s.workload == workload && s.phase == phase) {
            if let Some(n) = s.extents {
                by_target.entry(s.target.name()).or_default().push(n);
            }
        }
        by_target
            .into_iter()
            .map(|(t, mut v)| {
                v.sort_unstable();
                (t, v[v.len() / 2])
            })
            .collect()
    }

    /// Per target, the medians of the used bytes after `phase` and of what the
    /// run added to the fresh image (none when no run measured space).
    pub fn median_space(&self, workload: &str, phase: &str) -> Vec<(String, u64, u64)> {
        let mut by_target: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
        for s in self.samples.iter().filter(|s| s.workload == workload && s.phase == phase) {
            let (Some(used), Some(fresh)) = (s.used_bytes, s.fresh_used_bytes) else { continue };
            let name = s.target.name();
            let at = match by_target.iter().position(|(t, _, _)| *t == name) {
                Some(at) => at,
                None => {
                    by_target.push((name, Vec::new(), Vec::new()));
                    by_target.len() - 1
                }
            };
            by_target[at].1.push(used as f64);
            by_target[at].2.push(used.saturating_sub(fresh) as f64);
        }
        by_target.into_iter().map(|(t, mut u, mut a)| (t, median(&mut u) as u64, median(&mut a) as u64)).collect()
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "Command: `{}`  ", self.command);
        let _ = writeln!(md, "Machine: {}  ", self.machine);
        let _ = writeln!(md, "Load average (1, 5, 15 min) at start and end: {}  ", self.load_average.join(" / "));
        let _ = writeln!(md, "Images: `{}`, a fresh one for every run  ", self.mkfs);
        let _ = writeln!(md, "Runs: {} per target, interleaved; figures are medians.", self.runs);
        for skip in &self.skipped {
            let _ = writeln!(md, "\nSkipped **{}**: {}.", skip.target.name(), skip.reason);
        }
        for w in &self.workloads {
            let _ = writeln!(md, "\n### {}: {}\n\n{}; {} MiB image.\n", w.name, w.about, w.size, w.image_mb);
            let _ = writeln!(
                md,
                "| phase | target | median s | min..max s | ops/s | CPU s | vol. switches (per op) | time / uext4's |"
            );
            let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
            let mut device_lines = Vec::new();
            for phase in self.phases(&w.name) {
                for s in self.summarize(&w.name, &phase) {
                    let (lo, hi) = s.wall.iter().fold((f64::MAX, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                    let ratio = s.ratio_to_uext4.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into());
                    let _ = writeln!(
                        md,
                        "| {phase} | {} | {:.3} | {lo:.3}..{hi:.3} | {:.0} | {:.3} | {:.0} ({:.3}) | {ratio} |",
                        s.target.name(),
                        s.median_wall,
                        s.median_ops_per_s,
                        s.median_cpu,
                        s.median_voluntary,
                        s.median_voluntary / (s.median_ops_per_s * s.median_wall).max(1.0)
                    );
                    if let Some(d) = &s.device {
                        device_lines.push(format!(
                            "{phase} on {}: {} writes ({:.1} MiB), {} reads ({:.1} MiB), {} flushes",
                            s.target.name(),
                            d.writes,
                            d.write_bytes as f64 / 1048576.0,
                            d.reads,
                            d.read_bytes as f64 / 1048576.0,
                            d.flushes
                        ));
                    }
                }
            }
            let costs: Vec<String> = self
                .phases(&w.name)
                .iter()
                .flat_map(|phase| {
                    self.journal_costs(&w.name, phase)
                        .into_iter()
                        .map(move |(t, r)| format!("{phase} on {}: {r:.2}x", t.name()))
                })
                .collect();
            if !costs.is_empty() {
                let _ = writeln!(
                    md,
                    "\nCost of the journal (time with it / time without, per round, median): {}.",
                    costs.join("; ")
                );
            }
            let extent_lines: Vec<String> = self
                .phases(&w.name)
                .iter()
                .flat_map(|phase| {
                    self.median_extents(&w.name, phase).into_iter().map(move |(t, n)| format!("{phase} on {t}: {n}"))
                })
                .collect();
            if !extent_lines.is_empty() {
                let _ = writeln!(
                    md,
                    "\nExtents (`debugfs -R 'ex FILE' | wc -l` after the run, median): {}.",
                    extent_lines.join("; ")
                );
            }
            let space_lines: Vec<String> = self
                .phases(&w.name)
                .iter()
                .flat_map(|phase| {
                    self.median_space(&w.name, phase).into_iter().map(move |(t, used, added)| {
                        format!("{phase} on {t}: {} bytes in use, {} more than the fresh image", used, added)
                    })
                })
                .collect();
            if !space_lines.is_empty() {
                let _ = writeln!(
                    md,
                    "\nSpace (dumpe2fs after the run: blocks in use x block size, median): {}.",
                    space_lines.join("; ")
                );
            }
            if !device_lines.is_empty() {
                let _ = writeln!(md, "\nDevice requests (median per run): {}.", device_lines.join("; "));
            }
            let mut latency_rows = Vec::new();
            for phase in self.phases(&w.name) {
                for s in self.summarize(&w.name, &phase) {
                    let Some(p99) = s.median_p99_ms else { continue };
                    let kept = s.rate_kept.map(|r| format!("{r:.2}")).unwrap_or_else(|| "1 (the base)".into());
                    latency_rows.push(format!(
                        "| {phase} | {} | {:.0} | {kept} | {p99:.2} |",
                        s.target.name(),
                        s.median_ops_per_s
                    ));
                }
            }
            if !latency_rows.is_empty() {
                let _ = writeln!(
                    md,
                    "\nRate kept and latency (medians over runs): ops/s in the phase over ops/s in the first \
                     phase of the same run, and the 99th-percentile latency of one operation.\n"
                );
                let _ = writeln!(md, "| phase | target | ops/s | rate kept | p99 ms |");
                let _ = writeln!(md, "|---|---|---|---|---|");
                for row in latency_rows {
                    let _ = writeln!(md, "{row}");
                }
            }
            let mut model_rows = Vec::new();
            for phase in self.phases(&w.name) {
                for s in self.summarize(&w.name, &phase) {
                    let (Some(m), Some(d)) = (s.model, &s.device) else { continue };
                    let ratio = s.hdd_ratio_to_uext4.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into());
                    model_rows.push(format!(
                        "| {phase} | {} | {:.3} | {:.3} | {ratio} | {:.3} | {} | {} | {} |",
                        s.target.name(),
                        s.median_wall,
                        m.hdd_s,
                        m.ssd_s,
                        m.requests,
                        d.itable_blocks_written,
                        d.itable_block_writes
                    ));
                }
            }
            if !model_rows.is_empty() {
                let _ = writeln!(
                    md,
                    "\nModelled disk time (medians): the phase's device requests served one by one on the seeds' \
                     7200 rpm SATA disk and on a SATA SSD (uext4::dev::io_model; the kernel's requests from its \
                     block_rq_issue tracepoint), and the inode-table blocks they wrote.\n"
                );
                let _ = writeln!(
                    md,
                    "| phase | target | wall s | HDD model s | HDD / uext4's | SSD model s | requests | distinct inode-table blocks written | inode-table block writes |"
                );
                let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
                for row in model_rows {
                    let _ = writeln!(md, "{row}");
                }
            }
        }
        md
    }

    /// One PNG per workload: a panel per phase, a bar per target at its median
    /// time, the spread as an error bar and every run as a dot.
    pub fn plot(&self, workload: &str, path: &Path) -> Result<(), BenchError> {
        let phases = self.phases(workload);
        if phases.is_empty() {
            return Ok(());
        }
        let plot_err = |e: &dyn std::fmt::Display| BenchError(format!("plotting {}: {e}", path.display()));
        let width = (330 * phases.len() as u32 + 40).max(620);
        let root = BitMapBackend::new(path, (width, 400)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(&e))?;
        let root = root
            .titled(
                &format!("{workload}: seconds per phase (bar: median, line: min..max, dots: runs)"),
                ("sans-serif", 15),
            )
            .map_err(|e| plot_err(&e))?;
        for (panel, phase) in root.split_evenly((1, phases.len())).iter().zip(&phases) {
            let summaries = self.summarize(workload, phase);
            let n = summaries.len() as u32;
            let top = summaries.iter().flat_map(|s| s.wall.iter().copied()).fold(0f64, f64::max).max(1e-6) * 1.15;
            let names: Vec<String> = summaries.iter().map(|s| s.target.name()).collect();
            let mut chart = ChartBuilder::on(panel)
                .caption(phase, ("sans-serif", 16))
                .margin(8)
                .x_label_area_size(28)
                .y_label_area_size(52)
                // A segmented range a..b has a segment for b as well, so stop one short.
                .build_cartesian_2d((0u32..n.saturating_sub(1).max(1)).into_segmented(), 0f64..top)
                .map_err(|e| plot_err(&e))?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .light_line_style(TRANSPARENT)
                .y_desc("seconds")
                .x_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(i) => names.get(*i as usize).map(|s| s.to_string()).unwrap_or_default(),
                    _ => String::new(),
                })
                .draw()
                .map_err(|e| plot_err(&e))?;
            for (i, s) in summaries.iter().enumerate() {
                let color = Palette99::pick(self.targets.iter().position(|t| *t == s.target).unwrap_or(0));
                chart
                    .draw_series(
                        Histogram::vertical(&chart)
                            .style(color.mix(0.6).filled())
                            .margin(14)
                            .data([(i as u32, s.median_wall)]),
                    )
                    .map_err(|e| plot_err(&e))?;
                let (lo, hi) = s.wall.iter().fold((f64::MAX, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                chart
                    .draw_series([ErrorBar::new_vertical(
                        SegmentValue::CenterOf(i as u32),
                        lo,
                        s.median_wall,
                        hi,
                        BLACK.stroke_width(2),
                        12,
                    )])
                    .map_err(|e| plot_err(&e))?;
                chart
                    .draw_series(
                        s.wall.iter().map(|&v| Circle::new((SegmentValue::CenterOf(i as u32), v), 2, BLACK.filled())),
                    )
                    .map_err(|e| plot_err(&e))?;
            }
        }
        root.present().map_err(|e| plot_err(&e))
    }
}

/// Lets plotters draw text: it brings no font of its own.
pub fn load_font() -> Result<(), String> {
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let path = CANDIDATES
        .iter()
        .find(|p| Path::new(p).exists())
        .ok_or("no DejaVuSans.ttf found (Debian package fonts-dejavu-core)")?;
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| format!("{path} is not a usable font"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetKind;

    fn sample(target: Target, run: usize, wall_s: f64) -> Sample {
        Sample {
            workload: "w".into(),
            phase: "p".into(),
            target,
            run,
            threads: 1,
            ops: 10,
            wall_s,
            ops_per_s: 10.0 / wall_s,
            cpu_s: 0.0,
            voluntary_switches: 0,
            involuntary_switches: 0,
            device: None,
            model: None,
            latency_p99_ms: None,
            extents: None,
            used_bytes: None,
            fresh_used_bytes: None,
        }
    }

    fn uext4() -> Target {
        Target::plain(TargetKind::Uext4)
    }

    fn kernel() -> Target {
        Target::plain(TargetKind::Kernel)
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    /// The ratio is taken run by run against uext4's run in the same round, so a
    /// round where the machine was slow for everyone does not skew it.
    #[test]
    fn ratios_pair_runs_of_the_same_round() {
        let results = Results {
            command: String::new(),
            machine: String::new(),
            load_average: Vec::new(),
            quick: true,
            runs: 3,
            mkfs: String::new(),
            targets: vec![uext4(), kernel()],
            skipped: vec![Skipped { target: Target::plain(TargetKind::Fuse2fs), reason: "not here".into() }],
            workloads: vec![WorkloadInfo { name: "w".into(), about: "a".into(), size: "s".into(), image_mb: 1 }],
            samples: vec![
                sample(uext4(), 0, 1.0),
                sample(kernel(), 0, 2.0),
                sample(uext4(), 1, 10.0),
                sample(kernel(), 1, 30.0),
                sample(uext4(), 2, 2.0),
                sample(kernel(), 2, 8.0),
            ],
        };
        let summaries = results.summarize("w", "p");
        assert_eq!(summaries.len(), 2);
        assert_eq!(summaries[0].ratio_to_uext4, Some(1.0));
        // Per-round ratios 2, 3 and 4: median 3 (the ratio of medians would be 8/2 = 4).
        assert_eq!(summaries[1].ratio_to_uext4, Some(3.0));
        assert_eq!(summaries[1].median_wall, 8.0);
        let md = results.markdown();
        assert!(md.contains("Skipped **fuse2fs**: not here."), "{md}");
        assert!(md.contains("| p | kernel | 8.000 | 2.000..30.000 |"), "{md}");
        assert!(md.contains("| 3.00x |"), "{md}");
    }

    /// The rate kept pairs each run's phase with the first phase of the same
    /// run, and the p99 column appears only for phases that timed operations.
    #[test]
    fn rate_kept_pairs_a_phase_with_the_first_phase_of_its_run() {
        let phase = |phase: &str, run: usize, wall_s: f64, p99: f64| Sample {
            phase: phase.into(),
            latency_p99_ms: Some(p99),
            ..sample(uext4(), run, wall_s)
        };
        let results = Results {
            command: String::new(),
            machine: String::new(),
            load_average: Vec::new(),
            quick: true,
            runs: 2,
            mkfs: String::new(),
            targets: vec![uext4()],
            skipped: Vec::new(),
            workloads: vec![WorkloadInfo { name: "w".into(), about: "a".into(), size: "s".into(), image_mb: 1 }],
            samples: vec![
                phase("N=0", 0, 1.0, 0.1),
                phase("N=2", 0, 2.0, 0.5),
                // A slow round for everything: kept 0.5 again, not 10 / 1.
                phase("N=0", 1, 10.0, 0.3),
                phase("N=2", 1, 20.0, 0.7),
            ],
        };
        assert_eq!(results.rate_kept("w", "N=0", &uext4()), None);
        assert_eq!(results.rate_kept("w", "N=2", &uext4()), Some(0.5));
        assert_eq!(results.summarize("w", "N=2")[0].median_p99_ms, Some(0.6));
        let md = results.markdown();
        assert!(md.contains("| N=2 | uext4 | 3 | 0.50 | 0.60 |"), "{md}");
        assert!(md.contains("| N=0 | uext4 | 6 | 1 (the base) | 0.20 |"), "{md}");
    }
}
