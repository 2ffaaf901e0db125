//! `uext4 bench` as CI runs it: the whole `--quick` set once, on every target
//! this machine has. Speed is never judged here; what is checked is that every
//! workload ran on every available target the promised number of times (each
//! run's image passed e2fsck -fn inside the harness, or the command fails), that
//! unavailable targets are reported with a reason, and that the JSON, the
//! markdown tables and the PNG plots are all written.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Output};

fn uext4(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uext4")).args(args).output().expect("run uext4")
}

fn oracles_required() -> bool {
    std::env::var("UEXT4_REQUIRE_ORACLES").as_deref() == Ok("1")
}

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().map(|o| o.status.success()).unwrap_or(false)
}

fn workload_names() -> Vec<String> {
    let out = uext4(&["bench", "list"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with(' ') && !l.contains("not part of `all`"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn bench_refuses_unknown_names_in_one_line() {
    for args in [&["bench", "nosuchworkload"][..], &["bench", "smallfiles", "--targets", "uext4,zfs"]] {
        let out = uext4(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("unknown"), "{err}");
    }
    let out = uext4(&["bench", "smallfiles", "--targets", "kernel"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("uext4 target must be"));
}

#[test]
fn quick_bench_runs_every_workload_on_every_available_target() {
    if !have("mkfs.ext4") {
        assert!(!oracles_required(), "e2fsprogs is required");
        eprintln!("SKIPPED: the bench needs mkfs.ext4 and e2fsck");
        return;
    }
    let names = workload_names();
    for expected in [
        "smallfiles",
        "tree",
        "seqio",
        "randwrite",
        "randwrite-fsync",
        "untar",
        "populate",
        "fsync-files",
        "parallel",
        "crunl",
        "rndrename",
    ] {
        assert!(names.iter().any(|n| n == expected), "bench list lacks {expected}: {names:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let out = uext4(&["bench", "all", "--quick", "--out", out_dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "uext4 bench all --quick failed:\n{stderr}");

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    let runs = json["runs"].as_u64().unwrap();
    assert_eq!(runs, 3);
    let targets: BTreeSet<String> =
        json["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    let skipped: BTreeMap<String, String> = json["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["target"].as_str().unwrap().to_string(), s["reason"].as_str().unwrap().to_string()))
        .collect();
    // Every target the command was asked for is either measured or skipped with a reason.
    for t in ["uext4", "uext4-fuse", "uext4-fuse-uring", "kernel", "fuse2fs"] {
        assert!(targets.contains(t) != skipped.contains_key(t), "{t}: targets {targets:?}, skipped {skipped:?}");
        if let Some(reason) = skipped.get(t) {
            assert!(!reason.is_empty());
            assert!(stderr.contains(&format!("skipping target {t}: {reason}")), "{stderr}");
        }
    }
    assert!(targets.contains("uext4"));
    for t in ["uext4-fuse", "uext4-fuse-uring", "kernel", "fuse2fs"] {
        if !targets.contains(t) {
            assert!(!oracles_required(), "target {t} was skipped: {}", skipped[t]);
            eprintln!("NOTE: target {t} skipped here: {}", skipped[t]);
        }
    }

    // Per workload and phase, each target ran `runs` times with positive figures.
    let mut seen: BTreeMap<(String, String, String), BTreeSet<u64>> = BTreeMap::new();
    for s in json["samples"].as_array().unwrap() {
        assert!(s["wall_s"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["ops"].as_u64().unwrap() > 0, "{s}");
        assert!(s["cpu_s"].as_f64().unwrap() >= 0.0, "{s}");
        let target = s["target"].as_str().unwrap().to_string();
        // uext4's device layer and the kernel's loop device report figures; the FUSE targets none.
        assert_eq!(s["device"].is_object(), target == "uext4" || target == "kernel", "{s}");
        assert_eq!(s["model"].is_object(), target == "uext4" || (target == "kernel" && s["model"].is_object()), "{s}");
        let key = (s["workload"].as_str().unwrap().to_string(), s["phase"].as_str().unwrap().to_string(), target);
        seen.entry(key).or_default().insert(s["run"].as_u64().unwrap());
    }
    let markdown = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    for w in &names {
        let phases: BTreeSet<&String> = seen.keys().filter(|k| &k.0 == w).map(|k| &k.1).collect();
        assert!(!phases.is_empty(), "workload {w} has no samples");
        for phase in phases {
            for t in &targets {
                let runs_seen = seen.get(&(w.clone(), phase.clone(), t.clone())).cloned().unwrap_or_default();
                assert_eq!(runs_seen, (0..runs).collect::<BTreeSet<u64>>(), "{w}/{phase} on {t}");
                assert!(markdown.contains(&format!("| {phase} | {t} |")), "results.md lacks {w}/{phase}/{t}");
            }
        }
        assert!(markdown.contains(&format!("### {w}:")), "results.md lacks a table for {w}");
        let png = std::fs::read(out_dir.join(format!("{w}.png"))).unwrap_or_else(|e| panic!("{w}.png: {e}"));
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 5_000, "{w}.png is not a drawn plot");
    }
    // The ratio columns exist and uext4's own ratios are exactly 1 (time in the
    // main tables, modelled HDD time in the model tables).
    assert!(markdown.contains("| time / uext4's |") && markdown.contains("| HDD / uext4's |"));
    // The rate-kept table (phases that time each operation: fsync-storm) has no
    // ratio to uext4; its first phase is every target's base.
    for line in markdown.lines().filter(|l| l.contains("| uext4 |")) {
        match line.split('|').count() {
            11 => assert!(line.contains("| 1.00x |"), "{line}"),
            7 => assert!(!line.starts_with("| N=0 |") || line.contains("| 1 (the base) |"), "{line}"),
            _ => assert!(line.ends_with("| 1.00x |"), "{line}"),
        }
    }
    assert!(markdown.contains("| phase | target | ops/s | rate kept | p99 ms |"), "no rate-kept table");
}

/// With journaled and journal-less twins of a target, the tables show what the
/// journal costs each (time with it over time without).
#[test]
fn bench_reports_the_cost_of_the_journal() {
    if !have("mkfs.ext4") {
        assert!(!oracles_required(), "e2fsprogs is required");
        eprintln!("SKIPPED: the bench needs mkfs.ext4 and e2fsck");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let targets = "uext4,uext4-nojournal,kernel,kernel-nojournal";
    let out = uext4(&[
        "bench",
        "fsync-files",
        "--quick",
        "--runs",
        "1",
        "--targets",
        targets,
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let markdown = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    let cost_line = markdown.lines().find(|l| l.starts_with("Cost of the journal")).expect("a journal-cost line");
    assert!(cost_line.contains("create+fsync on uext4: "), "{cost_line}");
    let kernel_ran = markdown.contains("| create+fsync | kernel-nojournal |");
    assert!(kernel_ran || !oracles_required(), "the kernel targets were skipped:\n{markdown}");
    assert_eq!(cost_line.contains("create+fsync on kernel: "), kernel_ran, "{cost_line}");
    // Both uext4 twins report device figures; the journal-less one never writes a log.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    let flushes = |target: &str| {
        json["samples"].as_array().unwrap().iter().find(|s| s["target"] == target).unwrap()["device"]["flushes"]
            .as_u64()
            .unwrap()
    };
    // 300 fsyncs: the journal flushes before and after each commit block, the
    // journal-less one once per fsync.
    assert!(flushes("uext4") >= 600 && flushes("uext4-nojournal") >= 300, "{json}");
}

/// Targets with tunables, and the I/O model's figures: requests by class,
/// distinct inode-table blocks written, modelled HDD and SSD time, for uext4's
/// targets and (through its block tracepoint) the kernel.
#[test]
fn bench_reports_the_io_model_for_targets_with_tunables() {
    if !have("mkfs.ext4") {
        assert!(!oracles_required(), "e2fsprogs is required");
        eprintln!("SKIPPED: the bench needs mkfs.ext4 and e2fsck");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let targets = "uext4,uext4:dir_ireserve=low,kernel";
    let args = ["bench", "tree", "--quick", "--runs", "1", "--targets", targets, "--out", out_dir.to_str().unwrap()];
    let out = uext4(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    let sample = |target: &str, phase: &str| {
        json["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["target"] == target && s["phase"] == phase)
            .unwrap_or_else(|| panic!("no {phase} sample of {target}: {json}"))
            .clone()
    };
    let mut measured = vec!["uext4", "uext4:dir_ireserve=low"];
    if json["targets"].as_array().unwrap().iter().any(|t| t == "kernel") {
        measured.push("kernel");
    } else {
        assert!(!oracles_required(), "the kernel target was skipped: {json}");
    }
    for target in measured {
        let s = sample(target, "files");
        let classes = s["device"]["by_class"].as_object().unwrap_or_else(|| panic!("{target}: {s}"));
        for class in ["inode_table", "bitmap", "journal"] {
            assert!(classes[class]["write_blocks"].as_u64().unwrap() > 0, "{target}: no {class} writes: {s}");
        }
        if target != "kernel" {
            // The kernel's directory blocks are not tagged (nobody tells the model).
            assert!(classes["directory"]["write_blocks"].as_u64().unwrap() > 0, "{target}: {s}");
        }
        assert!(s["device"]["itable_blocks_written"].as_u64().unwrap() > 0, "{target}: {s}");
        let (hdd, ssd) = (s["model"]["hdd_s"].as_f64().unwrap(), s["model"]["ssd_s"].as_f64().unwrap());
        assert!(hdd > ssd && ssd > 0.0, "{target}: hdd {hdd} ssd {ssd}");
    }
    let markdown = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    assert!(markdown.contains("| files | uext4:dir_ireserve=low |"), "{markdown}");
    assert!(markdown.contains("HDD model s"), "{markdown}");
    assert!(markdown.contains("Load average"), "{markdown}");
}

/// Seed 002's benchmarks: every sample names its thread count, on a target
/// that carries pdirops=off as on the default one.
#[test]
fn bench_records_threads_for_seed_002s_workloads() {
    if !have("mkfs.ext4") {
        assert!(!oracles_required(), "e2fsprogs is required");
        eprintln!("SKIPPED: the bench needs mkfs.ext4 and e2fsck");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let targets = "uext4,uext4:pdirops=off";
    let args = [
        "bench",
        "crunl",
        "rndrename",
        "--quick",
        "--runs",
        "1",
        "--targets",
        targets,
        "--out",
        out_dir.to_str().unwrap(),
    ];
    let out = uext4(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    for workload in ["crunl", "rndrename"] {
        for target in ["uext4", "uext4:pdirops=off"] {
            for threads in [1, 2, 4] {
                let phase = format!("T={threads}");
                let found = json["samples"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|s| s["workload"] == workload && s["target"] == target && s["phase"] == phase.as_str());
                let s = found.unwrap_or_else(|| panic!("no {workload} {phase} sample of {target}: {json}"));
                assert_eq!(s["threads"], threads, "{s}");
                assert!(s["ops"].as_u64().unwrap() > 0, "{s}");
            }
        }
    }
    let markdown = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    assert!(markdown.contains("| T=2 | uext4:pdirops=off |"), "{markdown}");
}

/// `uext4 bench` with the seeds' workloads shrunk to seconds
/// (`UEXT4_BENCH_TINY=1`), one run on `targets`; returns the JSON and the
/// markdown, or None when e2fsprogs is missing here.
fn tiny_bench(workloads: &[&str], targets: &str) -> Option<(serde_json::Value, String)> {
    if !have("mkfs.ext4") || !have("dumpe2fs") {
        assert!(!oracles_required(), "e2fsprogs is required");
        eprintln!("SKIPPED: the bench needs mkfs.ext4, dumpe2fs and e2fsck");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("out");
    let work = dir.path().join("work");
    let mut args = vec!["bench"];
    args.extend(workloads);
    args.extend(["--runs", "1", "--targets", targets, "--out", out_dir.to_str().unwrap()]);
    args.extend(["--work", work.to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_uext4"))
        .args(&args)
        .env("UEXT4_BENCH_TINY", "1")
        .output()
        .expect("run uext4 bench");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("results.json")).unwrap()).unwrap();
    let markdown = std::fs::read_to_string(out_dir.join("results.md")).unwrap();
    Some((json, markdown))
}

/// The targets of `wanted` that ran (the kernel's may be skipped without root
/// or loop devices, but not where the oracles are required).
fn measured(json: &serde_json::Value, wanted: &[&'static str]) -> Vec<&'static str> {
    let ran: Vec<&str> = json["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let out: Vec<&'static str> = wanted.iter().copied().filter(|t| ran.contains(t)).collect();
    if out.len() < wanted.len() {
        assert!(!oracles_required(), "targets skipped: ran {ran:?} of {wanted:?}: {}", json["skipped"]);
    }
    out
}

fn phases_of(json: &serde_json::Value, workload: &str, target: &str) -> Vec<String> {
    json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["workload"] == workload && s["target"] == target)
        .map(|s| s["phase"].as_str().unwrap().to_string())
        .collect()
}

/// Seed 003's rmtree: every deletion order on the library, with the phase that
/// reopens it with hash_goal=on; the kernel runs all but that one (its
/// remove_tree is GNU rm -rf); every phase carries modelled disk time.
#[test]
fn bench_rmtree_runs_every_deletion_order() {
    let Some((json, markdown)) = tiny_bench(&["rmtree"], "uext4,kernel") else { return };
    let common = ["create", "readdir-order", "inode-order", "remove_tree"];
    for target in measured(&json, &["uext4", "kernel"]) {
        let mut expected: Vec<&str> = common.to_vec();
        if target == "uext4" {
            expected.push("hash-goal-readdir-order");
        }
        assert_eq!(phases_of(&json, "rmtree", target), expected, "{target}");
        for phase in expected {
            assert!(markdown.contains(&format!("| {phase} | {target} |")), "{phase} on {target}:\n{markdown}");
        }
    }
    for s in json["samples"].as_array().unwrap() {
        assert_eq!(s["ops"], 2000, "{s}");
        if s["target"] == "uext4" {
            assert!(s["model"]["hdd_s"].as_f64().unwrap() > 0.0, "{s}");
        }
    }
}

/// Seed 004's find and space workloads on images with inline_data, the
/// kernel beside itself on an image without it (`features=^inline_data`).
/// The kernel keeps the tree's files under 60 bytes in their inodes: it uses
/// fewer blocks with the feature than without; and on the tree whose every
/// directory fits its inode (`inline-find-small`), its cold find reads the
/// device fewer times with the feature than without.
#[test]
fn bench_inline_find_and_space_compare_images_with_and_without_the_feature() {
    let targets = "uext4,uext4:inline_data=off,kernel,kernel:features=^inline_data";
    let Some((json, markdown)) = tiny_bench(&["inline-find", "inline-find-small", "inline-space"], targets) else {
        return;
    };
    let ran = measured(&json, &["uext4", "uext4:inline_data=off", "kernel", "kernel:features=^inline_data"]);
    let find_reads = |target: &str| {
        let s = json["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["workload"] == "inline-find-small" && s["target"] == target && s["phase"] == "find -name a")
            .unwrap_or_else(|| panic!("no inline-find-small sample of {target}"));
        s["device"]["reads"].as_u64().unwrap_or_else(|| panic!("{s}"))
    };
    let space = |target: &str| {
        let s = json["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["workload"] == "inline-space" && s["target"] == target)
            .unwrap_or_else(|| panic!("no inline-space sample of {target}"));
        let (used, fresh) = (s["used_bytes"].as_u64().unwrap(), s["fresh_used_bytes"].as_u64().unwrap());
        assert!(used > fresh && used % 4096 == 0, "{s}");
        used - fresh
    };
    for &target in &ran {
        assert_eq!(phases_of(&json, "inline-find", target), ["find -name a", "lookup a"], "{target}");
        assert_eq!(phases_of(&json, "inline-find-small", target), ["find -name a", "lookup a"], "{target}");
        assert!(find_reads(target) > 0, "{target}");
        assert_eq!(phases_of(&json, "inline-space", target), ["create"], "{target}");
        assert!(markdown.contains(&format!("| find -name a | {target} |")), "{markdown}");
        space(target);
    }
    if ran.contains(&"kernel") {
        assert!(space("kernel") < space("kernel:features=^inline_data"), "{json}");
        assert!(find_reads("kernel") < find_reads("kernel:features=^inline_data"), "{json}");
    }
    assert!(markdown.contains("Space (dumpe2fs after the run"), "{markdown}");
    // Only the space workload measures space.
    assert!(json["samples"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| (s["workload"] == "inline-space") == s["used_bytes"].is_u64()));
}
