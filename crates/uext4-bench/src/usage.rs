//! Resource figures around a timed phase: CPU time and context switches of this
//! process (getrusage) plus those of a helper process that does the filesystem's
//! work elsewhere (a FUSE daemon), read from /proc.
//!
//! The kernel's own writeback threads are nobody's child: for the kernel target
//! CPU time covers only the system calls this process makes.

#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub cpu_s: f64,
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
}

impl std::ops::Sub for Usage {
    type Output = Usage;
    fn sub(self, earlier: Usage) -> Usage {
        Usage {
            cpu_s: self.cpu_s - earlier.cpu_s,
            voluntary_switches: self.voluntary_switches.saturating_sub(earlier.voluntary_switches),
            involuntary_switches: self.involuntary_switches.saturating_sub(earlier.involuntary_switches),
        }
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, other: Usage) -> Usage {
        Usage {
            cpu_s: self.cpu_s + other.cpu_s,
            voluntary_switches: self.voluntary_switches + other.voluntary_switches,
            involuntary_switches: self.involuntary_switches + other.involuntary_switches,
        }
    }
}

/// This process, all threads.
pub fn own_usage() -> Usage {
    // SAFETY: getrusage fills the struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Usage {
        cpu_s: secs(ru.ru_utime) + secs(ru.ru_stime),
        voluntary_switches: ru.ru_nvcsw as u64,
        involuntary_switches: ru.ru_nivcsw as u64,
    }
}

/// Another process, summed over its live threads. Missing figures read as zero:
/// the process may have exited, and then there is nothing more to count.
pub fn process_usage(pid: u32) -> Usage {
    let ticks = {
        // SAFETY: sysconf has no preconditions.
        let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if t > 0 {
            t as f64
        } else {
            100.0
        }
    };
    let mut usage = Usage::default();
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
            usage.cpu_s = (field(14) + field(15)) / ticks;
        }
    }
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
            for line in status.lines() {
                let number = |l: &str| l.split(':').nth(1).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
                if line.starts_with("voluntary_ctxt_switches") {
                    usage.voluntary_switches += number(line);
                } else if line.starts_with("nonvoluntary_ctxt_switches") {
                    usage.involuntary_switches += number(line);
                }
            }
        }
    }
    usage
}
