//! Seed 002's crunl, its phases interleaved in rounds, for measuring what two
//! threads share. `uext4 bench crunl` runs each phase once, for seconds, so a
//! machine whose speed drifts (a shared VM) moves one phase against another;
//! here T=1, T=2 in one directory and T=2 in two directories take turns, and
//! each is reported as the median of its rounds, with the per-round ratios.
//! The library is called directly (no paths), as `uext4 bench crunl` does
//! through its directory handles.
//!
//! ```sh
//! truncate -s 512M /tmp/c.img && mkfs.ext4 -q -F /tmp/c.img
//! cargo run --release --example pdirops_rounds -- /tmp/c.img 40000 5
//! ```
//! Arguments: image, create+unlink operations per phase, rounds, and
//! optionally the one phase to run (0, 1 or 2: for a profiler). Each
//! operation is create + open + close + unlink of one of the thread's own 64
//! names in a directory of 5,000 names (an htree). The image is changed.

use std::sync::Arc;
use std::time::Instant;
use uext4::{Filesystem, Options, Owner};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

/// (name, threads, each thread in a directory of its own)
const PHASES: [(&str, u64, bool); 3] = [("T=1", 1, false), ("T=2 same", 2, false), ("T=2 apart", 2, true)];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        return Err("usage: pdirops_rounds IMAGE OPS ROUNDS [PHASE]".into());
    }
    let (ops, rounds): (u64, usize) = (args[2].parse()?, args[3].parse()?);
    let only: Option<usize> = args.get(4).map(|p| p.parse()).transpose()?;
    let fs = Arc::new(Filesystem::open(&args[1], Options { read_only: false, ..Default::default() })?);
    let mut dirs = Vec::new();
    for d in 0..2 {
        let dir = fs.mkdir(uext4::ROOT_INO, format!("rounds-{d}").as_bytes(), 0o755, ROOT)?.ino;
        for i in 0..5000 {
            fs.create(dir, format!("prefill-{i:05}").as_bytes(), 0o644, ROOT)?;
        }
        dirs.push(dir);
    }
    // Per phase, per round: (ops/s, CPU seconds of the process).
    let mut results: Vec<Vec<(f64, f64)>> = vec![Vec::new(); PHASES.len()];
    for _ in 0..rounds {
        for (p, &(_, threads, apart)) in PHASES.iter().enumerate() {
            if only.is_some_and(|o| o != p) {
                continue;
            }
            let cpu_before = process_cpu_s()?;
            let start = Instant::now();
            std::thread::scope(|s| -> uext4::Result<()> {
                let workers: Vec<_> = (0..threads)
                    .map(|t| {
                        let (fs, dir) = (&fs, dirs[if apart { t as usize } else { 0 }]);
                        s.spawn(move || -> uext4::Result<()> {
                            for i in 0..ops / threads {
                                // Cycling over names, as `uext4 bench crunl`: one
                                // fixed name's place in its leaf sets its cost.
                                let name = format!("f-{t}-{}", i % 64);
                                let ino = fs.create(dir, name.as_bytes(), 0o644, ROOT)?.ino;
                                fs.open_inode(ino)?;
                                fs.close_inode(ino)?;
                                fs.unlink(dir, name.as_bytes())?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                workers.into_iter().try_for_each(|w| w.join().expect("a worker panicked"))
            })?;
            results[p].push((ops as f64 / start.elapsed().as_secs_f64(), process_cpu_s()? - cpu_before));
        }
    }
    let base = median(results[0].iter().map(|r| r.0));
    for (p, (name, _, _)) in PHASES.iter().enumerate() {
        if results[p].is_empty() {
            continue;
        }
        let rate = median(results[p].iter().map(|r| r.0));
        let cpu = median(results[p].iter().map(|r| r.1));
        let ratios: Vec<String> = match base {
            Some(_) => results[p].iter().zip(&results[0]).map(|(x, one)| format!("{:.2}", x.0 / one.0)).collect(),
            None => Vec::new(),
        };
        let against_one = base.zip(rate).map(|(b, r)| format!(" ({:.2}x T=1)", r / b)).unwrap_or_default();
        println!(
            "{name:10} ops/s {:8.0}{against_one} CPU s per round {:.2}  per-round ratios {}",
            rate.unwrap_or(0.0),
            cpu.unwrap_or(0.0),
            ratios.join(" ")
        );
    }
    Ok(())
}

fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// User plus system CPU seconds of this process so far (/proc/self/stat).
fn process_cpu_s() -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64, Box<dyn std::error::Error>> {
        Ok(fields.get(i).ok_or("short /proc/self/stat")?.parse::<f64>()?)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11)? + ticks(12)?) / hz)
}
