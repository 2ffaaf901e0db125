//! The kernel's block requests, priced by uext4's I/O model.
//!
//! blktrace cannot open its per-device relay files on this machine ("Operation
//! not permitted" from /sys/kernel/debug/block/loopN), but the tracepoint it
//! records, `block:block_rq_issue` (a request handed to the driver: device,
//! direction, sector, length), is readable through tracefs. A private tracing
//! instance (so nobody else's tracing is disturbed) records it; a thread reads
//! the instance's trace_pipe and feeds the loop device's requests to an
//! `IoModel` whose classes came from a read-only uext4 open of the image, so
//! the kernel's requests are sorted and priced exactly as uext4's are (blocks
//! the geometry does not fix, directories and extent nodes, count as file data:
//! nobody tags them).
//!
//! To read the figures up to now, `report` writes a marker into the instance
//! and waits until the reader has passed it: every request issued before the
//! marker has then been counted.

use parking_lot::{Condvar, Mutex};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uext4::dev::io_model::Direction;
use uext4::dev::{IoModel, IoReport};

const TRACEFS: &str = "/sys/kernel/tracing";
const MARK: &str = "uext4-bench-mark";

struct Shared {
    model: IoModel,
    /// (major, minor) of the loop device followed.
    device: Mutex<Option<(u32, u32)>>,
    /// The last marker the reader has passed.
    seen: Mutex<u64>,
    passed: Condvar,
    stop: AtomicBool,
}

pub struct KernelTrace {
    instance: PathBuf,
    shared: Arc<Shared>,
    marks: AtomicU64,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl KernelTrace {
    /// Classifies `image`'s blocks and starts tracing (no device followed yet).
    pub fn start(image: &Path) -> Result<KernelTrace, String> {
        let model = IoModel::default();
        let shared = Arc::new(Shared {
            model,
            device: Mutex::new(None),
            seen: Mutex::new(0),
            passed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        classify(image, &shared)?;
        if !Path::new(TRACEFS).join("instances").exists() {
            let _ = std::process::Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]).status();
        }
        let instance = Path::new(TRACEFS).join("instances").join(format!("uext4-bench-{}", std::process::id()));
        std::fs::create_dir(&instance).map_err(|e| format!("{}: {e}", instance.display()))?;
        let write = |file: &str, value: &str| {
            std::fs::write(instance.join(file), value).map_err(|e| format!("{}/{file}: {e}", instance.display()))
        };
        let set_up = write("buffer_size_kb", "65536")
            .and_then(|()| write("events/block/block_rq_issue/enable", "1"))
            .and_then(|()| write("tracing_on", "1"));
        let pipe = set_up
            .and_then(|()| std::fs::File::open(instance.join("trace_pipe")).map_err(|e| format!("trace_pipe: {e}")));
        let pipe = match pipe {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir(&instance);
                return Err(e);
            }
        };
        let reader_shared = shared.clone();
        let reader = std::thread::Builder::new()
            .name("kernel-trace".into())
            .spawn(move || read_pipe(pipe, &reader_shared))
            .map_err(|e| format!("starting the trace reader: {e}"))?;
        Ok(KernelTrace { instance, shared, marks: AtomicU64::new(0), reader: Some(reader) })
    }

    /// Follows the block device `path` (a loop device) from now on.
    pub fn follow_device(&self, path: &str) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        let rdev = std::fs::metadata(path).map_err(|e| format!("{path}: {e}"))?.rdev();
        *self.shared.device.lock() = Some((libc::major(rdev), libc::minor(rdev)));
        Ok(())
    }

    /// Waits until every request traced so far is counted.
    fn drain(&self) {
        let n = self.marks.fetch_add(1, Ordering::Relaxed) + 1;
        let marked = std::fs::OpenOptions::new()
            .write(true)
            .open(self.instance.join("trace_marker"))
            .and_then(|mut f| f.write_all(format!("{MARK} {n}\n").as_bytes()));
        if marked.is_err() {
            return;
        }
        let mut seen = self.shared.seen.lock();
        while *seen < n {
            if self.shared.passed.wait_for(&mut seen, Duration::from_secs(10)).timed_out() {
                eprintln!("kernel trace: marker {n} not seen after 10 s; figures may be short");
                return;
            }
        }
    }

    pub fn report(&self) -> IoReport {
        self.drain();
        self.shared.model.report()
    }

    pub fn new_epoch(&self) {
        self.drain();
        self.shared.model.new_epoch();
    }
}

impl Drop for KernelTrace {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::write(self.instance.join("tracing_on"), "0");
        let _ = std::fs::write(self.instance.join("events/block/block_rq_issue/enable"), "0");
        // The reader blocks in trace_pipe until something arrives: a marker.
        let _ = std::fs::write(self.instance.join("tracing_on"), "1");
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(self.instance.join("trace_marker"))
            .and_then(|mut f| f.write_all(format!("{MARK} stop\n").as_bytes()));
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let _ = std::fs::remove_dir(&self.instance);
    }
}

/// A read-only uext4 open of the image, with the model attached, registers the
/// fixed classes; what that open read is then forgotten.
fn classify(image: &Path, shared: &Arc<Shared>) -> Result<(), String> {
    // The model lives in `shared`; the open needs an Arc of its own, so the
    // classes are copied over by opening with a second model and asking it.
    let probe = Arc::new(IoModel::default());
    let opts = uext4::Options { io_model: Some(probe.clone()), ..Default::default() };
    drop(uext4::Filesystem::open(image, opts).map_err(|e| format!("uext4 cannot read {}: {e}", image.display()))?);
    shared.model.classes().add_fixed(probe.classes().fixed_ranges());
    Ok(())
}

fn read_pipe(pipe: std::fs::File, shared: &Shared) {
    let mut lines = BufReader::new(pipe);
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if let Some(at) = line.find(MARK) {
            let tail = line[at + MARK.len()..].trim();
            if tail == "stop" && shared.stop.load(Ordering::Relaxed) {
                return;
            }
            if let Ok(n) = tail.parse::<u64>() {
                let mut seen = shared.seen.lock();
                *seen = (*seen).max(n);
                shared.passed.notify_all();
            }
            continue;
        }
        let Some(request) = parse_issue(&line) else { continue };
        if Some(request.device) != *shared.device.lock() {
            continue;
        }
        match request.kind {
            Kind::Flush => shared.model.record_flush(),
            Kind::Io(direction) => shared.model.record(direction, request.sector * 512, request.sectors * 512),
        }
    }
}

#[derive(Debug, PartialEq)]
enum Kind {
    Io(Direction),
    Flush,
}

#[derive(Debug, PartialEq)]
struct Issued {
    device: (u32, u32),
    kind: Kind,
    sector: u64,
    sectors: u64,
}

/// One `block_rq_issue` line: `... block_rq_issue: 7,0 WS 4096 () 15944 + 8 ...`.
fn parse_issue(line: &str) -> Option<Issued> {
    let rest = &line[line.find("block_rq_issue: ")? + "block_rq_issue: ".len()..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (major, minor) = fields.first()?.split_once(',')?;
    let device = (major.parse().ok()?, minor.parse().ok()?);
    let rwbs = *fields.get(1)?;
    let plus = fields.iter().position(|&f| f == "+")?;
    let sector: u64 = fields.get(plus - 1)?.parse().ok()?;
    let sectors: u64 = fields.get(plus + 1)?.parse().ok()?;
    let kind = if rwbs.contains('R') {
        Kind::Io(Direction::Read)
    } else if rwbs.contains('W') && sectors > 0 {
        Kind::Io(Direction::Write)
    } else if rwbs.starts_with('F') {
        Kind::Flush
    } else {
        return None;
    };
    Some(Issued { device, kind, sector, sectors })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue_lines_parse_as_the_tracepoint_prints_them() {
        let read = "  bash-4844 [000] ..... 2395.837016: block_rq_issue: 7,0 RM 1024 () 15944 + 2 be,0,4 [bash]";
        assert_eq!(
            parse_issue(read),
            Some(Issued { device: (7, 0), kind: Kind::Io(Direction::Read), sector: 15944, sectors: 2 })
        );
        let write = " kworker/u8:1-99 [001] ..... 10.5: block_rq_issue: 7,3 WS 4096 () 2048 + 8 be,0,4 [kworker/u8:1]";
        assert_eq!(parse_issue(write).map(|i| (i.device, i.kind)), Some(((7, 3), Kind::Io(Direction::Write))));
        let flush = " jbd2/loop0-8-5 [000] ..... 10.6: block_rq_issue: 7,0 FF 0 () 0 + 0 none,0,0 [jbd2/loop0-8]";
        assert_eq!(parse_issue(flush).map(|i| i.kind), Some(Kind::Flush));
        assert_eq!(parse_issue("tracing_mark_write: uext4-bench-mark 3"), None);
    }
}
