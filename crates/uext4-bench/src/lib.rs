//! The benchmark harness behind `uext4 bench`: workloads run side by side on
//! uext4's library, uext4's FUSE mount, the kernel's ext4 and fuse2fs.
//!
//! Every run gets a fresh image from mkfs.ext4 with the same parameters; runs of
//! the targets are interleaved (A B C, then B C A, ...) so that the machine's
//! drift falls on all of them alike; every image passes `e2fsck -fn` after its run
//! (outside the timing) or the bench stops. Results are medians and spread per
//! phase, each target's time relative to uext4's in the same round, written as
//! markdown, JSON (every sample) and PNG plots.
//!
//! Adding a workload: implement `workload::Workload` and list it in `workload::all`.

pub mod inline_data;
pub mod kernel_trace;
pub mod ops;
pub mod report;
pub mod rmtree;
pub mod target;
pub mod usage;
pub mod workload;

use report::{DeviceFigures, Results, Sample, Skipped, WorkloadInfo};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use target::{run_tool, Session, Target};
use usage::own_usage;
use workload::{Phases, Workload};

/// Anything that stops a bench run, in words.
#[derive(Debug)]
pub struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

#[derive(clap::Args, Debug)]
#[command(after_help = "Workloads: `uext4 bench list`. Targets: uext4 (the library), uext4-fuse (its mount,\n\
requests through /dev/fuse), uext4-fuse-uring (through io_uring: switches on the fuse module's enable_uring),\n\
kernel, fuse2fs, and uext4-nojournal, kernel-nojournal (images made with -O ^has_journal: with their journaled twins,\n\
the tables show what journaling costs each). Tunables after a colon: uext4's options for its own kinds\n\
(`uext4:hash_goal=on,cache_mb=16`; the mounts also `writeback_cache=on`, and uext4-fuse `threads=N` and `splice_read=off`),\n\
and for every kind `features=LIST`, added to the image's mkfs.ext4 -O\n\
(`kernel:features=^inline_data`; `+` joins several).\n\
Every run uses a fresh image from mkfs.ext4 -b 4096 and is checked with e2fsck -fn afterwards.")]
pub struct BenchArgs {
    /// `list`, `all`, or workload names
    #[arg(required = true, value_name = "WORKLOAD")]
    pub workloads: Vec<String>,
    /// Small sizes: everything finishes in about a minute (for CI and the demo)
    #[arg(long)]
    pub quick: bool,
    /// Comma-separated targets; ones that cannot run here are reported as skipped
    #[arg(long, value_delimiter = ',', default_value = "uext4,uext4-fuse,uext4-fuse-uring,kernel,fuse2fs")]
    pub targets: Vec<String>,
    /// Runs per target (the medians are over these)
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Where the tables, JSON and plots go
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Where images and mount points live while running (default: a new temporary directory)
    #[arg(long)]
    pub work: Option<PathBuf>,
}

/// `uext4 bench ...`
pub fn run(args: &BenchArgs) -> Result<(), BenchError> {
    if args.workloads.iter().any(|w| w == "list") {
        for w in workload::all() {
            println!("{:<16} {}", w.name(), w.about());
            println!("{:<16} full: {}; --quick: {}", "", w.size(false), w.size(true));
        }
        for w in workload::by_name_only() {
            println!("{:<16} {} (by name only, not part of `all`)", w.name(), w.about());
            println!("{:<16} full: {}; --quick: {}", "", w.size(false), w.size(true));
        }
        return Ok(());
    }
    let workloads = chosen_workloads(&args.workloads)?;
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    for name in &args.targets {
        let target = Target::parse(name).map_err(BenchError)?;
        match target.unavailable_because() {
            None => targets.push(target),
            Some(reason) => {
                eprintln!("skipping target {}: {reason}", target.name());
                skipped.push(Skipped { target, reason });
            }
        }
    }
    if !targets.iter().any(|t| t.is_base()) {
        return Err(BenchError("the uext4 target must be among --targets: ratios are taken against it".into()));
    }
    if args.runs == 0 {
        return Err(BenchError("--runs must be at least 1".into()));
    }
    for tool in ["mkfs.ext4", "e2fsck"] {
        if !target::on_path(tool) {
            return Err(BenchError(format!("{tool} is needed (Debian package e2fsprogs)")));
        }
    }
    let scratch = match &args.work {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| BenchError(format!("{}: {e}", dir.display())))?;
            tempfile::tempdir_in(dir)
        }
        None => tempfile::tempdir(),
    }
    .map_err(|e| BenchError(format!("making a work directory: {e}")))?;
    std::fs::create_dir_all(&args.out).map_err(|e| BenchError(format!("{}: {e}", args.out.display())))?;

    let mut results = Results {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine_description(),
        load_average: vec![load_average()],
        quick: args.quick,
        runs: args.runs,
        mkfs: format!("mkfs.ext4 {} IMAGE SIZE", MKFS_ARGS.join(" ")),
        targets: targets.clone(),
        skipped,
        workloads: Vec::new(),
        samples: Vec::new(),
    };
    let total = workloads.len() * args.runs * targets.len();
    let mut done = 0;
    let started = Instant::now();
    for w in workloads {
        let input = scratch.path().join(format!("input-{}", w.name()));
        std::fs::create_dir_all(&input).map_err(|e| BenchError(format!("{}: {e}", input.display())))?;
        w.prepare(args.quick, &input)?;
        results.workloads.push(WorkloadInfo {
            name: w.name().into(),
            about: w.about().into(),
            size: w.size(args.quick),
            image_mb: w.image_mb(args.quick),
        });
        for run in 0..args.runs {
            for k in 0..targets.len() {
                let target = targets[(k + run) % targets.len()].clone();
                done += 1;
                let samples = run_once(w, args.quick, &target, run, &input, scratch.path())?;
                let phases: Vec<String> = samples.iter().map(|s| format!("{} {:.3} s", s.phase, s.wall_s)).collect();
                eprintln!(
                    "[{done}/{total} {:.0}s] {} on {} (run {}): {}",
                    started.elapsed().as_secs_f64(),
                    w.name(),
                    target.name(),
                    run + 1,
                    phases.join(", ")
                );
                results.samples.extend(samples);
            }
        }
        std::fs::remove_dir_all(&input).map_err(|e| BenchError(format!("{}: {e}", input.display())))?;
    }
    results.load_average.push(load_average());
    write_outputs(&results, &args.out)
}

fn chosen_workloads(names: &[String]) -> Result<Vec<&'static dyn Workload>, BenchError> {
    if names.iter().any(|n| n == "all") {
        return Ok(workload::all());
    }
    let mut out: Vec<&'static dyn Workload> = Vec::new();
    for name in names {
        let w = workload::by_name(name)
            .ok_or_else(|| BenchError(format!("unknown workload '{name}' (see `uext4 bench list`)")))?;
        if !out.iter().any(|o| o.name() == w.name()) {
            out.push(w);
        }
    }
    Ok(out)
}

/// The same for every target: 4 KiB blocks, everything else mke2fs.conf's ext4 defaults.
const MKFS_ARGS: [&str; 4] = ["-F", "-q", "-b", "4096"];

fn run_once(
    w: &dyn Workload,
    quick: bool,
    target: &Target,
    run: usize,
    input: &Path,
    scratch: &Path,
) -> Result<Vec<Sample>, BenchError> {
    let image = scratch.join("image.ext4");
    let mountpoint = scratch.join("mnt");
    let _ = std::fs::remove_file(&image);
    std::fs::create_dir_all(&mountpoint).map_err(|e| BenchError(format!("{}: {e}", mountpoint.display())))?;
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(MKFS_ARGS);
    if !target.has_journal() {
        mkfs.args(["-O", "^has_journal"]);
    }
    mkfs.args(w.mkfs_args(quick));
    // After the workload's own -O, so that the target's word is the last.
    if let Some(features) = target.mkfs_features() {
        mkfs.args(["-O", &features]);
    }
    run_tool(mkfs.arg(&image).arg(format!("{}M", w.image_mb(quick))))?;
    let fresh_used = match w.space_phase() {
        Some(_) => Some(used_bytes(&image)?),
        None => None,
    };
    let session = target.attach(&image, &mountpoint, &w.uext4_defaults(quick), &w.kernel_mount_options())?;
    let mut runner = Runner {
        session: Some(session),
        workload: w.name(),
        target: target.clone(),
        run,
        samples: Vec::new(),
        threads: 1,
    };
    let outcome = w.run(quick, input, &mut runner);
    let finished = runner.session.take().map(|s| s.finish()).unwrap_or(Ok(()));
    outcome.map_err(|e| BenchError(format!("{} on {}: {e}", w.name(), target.name())))?;
    finished?;
    let check = Command::new("e2fsck").args(["-fn"]).arg(&image).output();
    match check {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            return Err(BenchError(format!(
                "e2fsck -fn finds errors in the image {} left after {}:\n{}",
                target.name(),
                w.name(),
                String::from_utf8_lossy(&out.stdout)
            )))
        }
        Err(e) => return Err(BenchError(format!("running e2fsck: {e}"))),
    }
    let mut samples = runner.samples;
    for (phase, path) in w.extent_files(quick) {
        let count = debugfs_extent_lines(&image, &path)?;
        for s in samples.iter_mut().filter(|s| s.phase == phase) {
            s.extents = Some(count);
        }
    }
    if let (Some(phase), Some(fresh)) = (w.space_phase(), fresh_used) {
        let used = used_bytes(&image)?;
        for s in samples.iter_mut().filter(|s| s.phase == phase) {
            s.used_bytes = Some(used);
            s.fresh_used_bytes = Some(fresh);
        }
    }
    std::fs::remove_file(&image).map_err(|e| BenchError(format!("{}: {e}", image.display())))?;
    Ok(samples)
}

/// Bytes in use on a detached image: (block count - free blocks) x block
/// size, the free blocks summed over the group descriptors as dumpe2fs lists
/// them (the superblock's total may lag: the kernel and e2fsck -n leave it).
fn used_bytes(image: &Path) -> Result<u64, BenchError> {
    let out = run_tool(Command::new("dumpe2fs").arg(image).stderr(std::process::Stdio::null()))?;
    parse_used_bytes(&out).ok_or_else(|| BenchError(format!("dumpe2fs {}: no block count or size", image.display())))
}

fn parse_used_bytes(dumpe2fs: &str) -> Option<u64> {
    let header =
        |key: &str| dumpe2fs.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse::<u64>().ok()));
    let (count, size) = (header("Block count:")?, header("Block size:")?);
    // Group lines: "  1234 free blocks, 567 free inodes, 2 directories, ..."
    let free: u64 = dumpe2fs
        .lines()
        .filter_map(|l| l.trim_start().split_once(" free blocks, ").and_then(|(n, _)| n.parse::<u64>().ok()))
        .sum();
    Some(count.checked_sub(free)? * size)
}

/// `debugfs -R 'ex PATH' IMAGE | wc -l`: how seed 001 counted a file's extents
/// (the header line and index nodes included, as there).
fn debugfs_extent_lines(image: &Path, path: &str) -> Result<u64, BenchError> {
    let out = run_tool(Command::new("debugfs").arg("-R").arg(format!("ex /{path}")).arg(image))?;
    Ok(out.lines().count() as u64)
}

/// Carries out a workload's phases on one session and records them.
struct Runner {
    session: Option<Box<dyn Session>>,
    workload: &'static str,
    target: Target,
    run: usize,
    samples: Vec<Sample>,
    /// Threads of the next timed phase (`Phases::threads`).
    threads: u64,
}

impl Runner {
    fn session(&mut self) -> &mut Box<dyn Session> {
        self.session.as_mut().expect("session is present until the run finishes")
    }
}

impl Phases for Runner {
    fn timed(
        &mut self,
        name: &str,
        ops: u64,
        body: &mut dyn FnMut(&dyn ops::FsOps) -> io::Result<()>,
    ) -> Result<(), BenchError> {
        self.timed_latencies(name, ops, &mut |fs| body(fs).map(|()| Vec::new()))
    }

    fn timed_latencies(
        &mut self,
        name: &str,
        ops: u64,
        body: &mut dyn FnMut(&dyn ops::FsOps) -> io::Result<Vec<Duration>>,
    ) -> Result<(), BenchError> {
        let session = self.session();
        session.begin_phase();
        let usage_before = own_usage() + session.helper_usage();
        let device_before = session.device();
        let clock = Instant::now();
        let mut latencies = body(session.ops())
            .and_then(|latencies| session.ops().sync().map(|()| latencies))
            .map_err(|e| BenchError(format!("phase {name}: {e}")))?;
        let wall_s = clock.elapsed().as_secs_f64();
        let usage = own_usage() + session.helper_usage() - usage_before;
        let (device, model) = DeviceFigures::between(&device_before, &session.device());
        self.samples.push(Sample {
            workload: self.workload.into(),
            phase: name.into(),
            target: self.target.clone(),
            run: self.run,
            threads: std::mem::replace(&mut self.threads, 1),
            ops,
            wall_s,
            ops_per_s: ops as f64 / wall_s.max(1e-9),
            cpu_s: usage.cpu_s,
            voluntary_switches: usage.voluntary_switches,
            involuntary_switches: usage.involuntary_switches,
            device,
            model,
            latency_p99_ms: percentile_99(&mut latencies).map(|d| d.as_secs_f64() * 1000.0),
            extents: None,
            used_bytes: None,
            fresh_used_bytes: None,
        });
        Ok(())
    }

    fn untimed(&mut self, body: &mut dyn FnMut(&dyn ops::FsOps) -> io::Result<()>) -> Result<(), BenchError> {
        let session = self.session();
        body(session.ops()).and_then(|()| session.ops().sync()).map_err(|e| BenchError(format!("set-up: {e}")))
    }

    fn restart(&mut self) -> Result<(), BenchError> {
        self.session().restart()
    }

    fn set_zeroout(&mut self, blocks: u32) -> Result<(), BenchError> {
        let target = self.target.name();
        self.session().set_zeroout(blocks).map_err(|e| BenchError(format!("{target}: {e}")))
    }

    fn threads(&mut self, threads: u64) {
        self.threads = threads;
    }

    fn reopen_with(&mut self, tunables: &[(&str, &str)]) -> Result<bool, BenchError> {
        let owned: Vec<(String, String)> = tunables.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let target = self.target.name();
        self.session().reopen_with(&owned).map_err(|e| BenchError(format!("{target}: {e}")))
    }
}

/// The 99th percentile (nearest rank) of `latencies`; None when there are none.
fn percentile_99(latencies: &mut [Duration]) -> Option<Duration> {
    latencies.sort_unstable();
    let rank = (latencies.len() * 99).div_ceil(100);
    latencies.get(rank.checked_sub(1)?).copied()
}

/// /proc/loadavg's first three figures: how busy this shared machine was.
fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn machine_description() -> String {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<f64>().ok()))
        .map(|kib| kib / 1048576.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let e2fsprogs = Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("").trim().to_string())
        .unwrap_or_default();
    format!("{cpus} CPUs, {mem_gib:.0} GiB, Linux {}, {e2fsprogs}", kernel.trim())
}

fn write_outputs(results: &Results, out: &Path) -> Result<(), BenchError> {
    let write = |name: &str, data: &[u8]| {
        let path = out.join(name);
        std::fs::write(&path, data).map_err(|e| BenchError(format!("{}: {e}", path.display())))
    };
    let json = serde_json::to_vec_pretty(results).map_err(|e| BenchError(format!("encoding results: {e}")))?;
    write("results.json", &json)?;
    let markdown = results.markdown();
    write("results.md", markdown.as_bytes())?;
    match report::load_font() {
        Ok(()) => {
            for w in &results.workloads {
                results.plot(&w.name, &out.join(format!("{}.png", w.name)))?;
            }
        }
        Err(why) => eprintln!("plots not drawn: {why}"),
    }
    println!("{markdown}");
    eprintln!("results, JSON and plots are in {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{parse_used_bytes, percentile_99};
    use std::time::Duration;

    #[test]
    fn used_bytes_sum_the_groups_free_blocks() {
        let dumpe2fs = "Block count:              16384\nFree blocks:              1\nBlock size:               4096\n\
                        Group 0: (Blocks 0-32767)\n  100 free blocks, 5 free inodes, 2 directories\n\
                        Group 1: (Blocks 32768-65535)\n  284 free blocks, 8192 free inodes, 0 directories, 8192 unused inodes\n";
        assert_eq!(parse_used_bytes(dumpe2fs), Some((16384 - 384) * 4096));
        assert_eq!(parse_used_bytes("Block size: 4096\n"), None);
    }

    #[test]
    fn the_99th_percentile_is_the_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        assert_eq!(percentile_99(&mut []), None);
        assert_eq!(percentile_99(&mut [ms(7)]), Some(ms(7)));
        // 100 values 1..=100: rank 99 is 99; 200 values: rank 198.
        let mut hundred: Vec<Duration> = (1..=100).rev().map(ms).collect();
        assert_eq!(percentile_99(&mut hundred), Some(ms(99)));
        let mut two_hundred: Vec<Duration> = (1..=200).map(ms).collect();
        assert_eq!(percentile_99(&mut two_hundred), Some(ms(198)));
    }
}
