//! The command line misused, and images uext4 will not open (issue 12, items 2, 9
//! and 12). Judged by e2fsck -fn, debugfs, dumpe2fs -h, GNU coreutils and the
//! kernel: operands naming '.', '..' or the root are refused before the image
//! changes by a single byte, and GNU coreutils fail on the same operands; errors
//! carry the errno text GNU prints and name the operand; where the operands are
//! fine, uext4's commands leave the tree GNU's leave on a kernel mount; `info`
//! shows the superblock of images it cannot open as dumpe2fs -h does; a descriptor
//! checksum mismatch opens read-only as the kernel mounts it; names with control
//! bytes never reach the terminal raw.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn have(tool: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success())
}

/// e2fsprogs for every test; root and loop devices for the kernel's side.
fn oracles(need_kernel: bool) -> bool {
    if !["mkfs.ext4", "debugfs", "dumpe2fs", "e2fsck"].iter().all(|t| have(t)) {
        return !skip("e2fsprogs is not installed");
    }
    if need_kernel && !is_root() {
        return !skip("the kernel's view needs root (loop mounts)");
    }
    true
}

fn uext4_out(args: &[String]) -> Output {
    uext4().args(args).output().unwrap()
}

fn debugfs_w(image: &Path, requests: &[String]) {
    let script = image.with_extension("debugfs");
    fs::write(&script, requests.join("\n") + "\n").unwrap();
    run(Command::new("debugfs").arg("-w").arg("-f").arg(&script).arg(image));
}

/// e2fsck -fn's findings (its header and timing lines left out).
fn e2fsck_findings(image: &Path) -> (Option<i32>, String) {
    let out = Command::new("e2fsck").arg("-fn").arg(image).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A 32 MiB image made and filled by e2fsprogs alone: /sub/f (a file), /a/b/c.
fn base_image(dir: &Path) -> PathBuf {
    let image = dir.join("base.img");
    mkfs(&image, "32M");
    let host = dir.join("f.host");
    fs::write(&host, b"the file f\n").unwrap();
    debugfs_w(
        &image,
        &["mkdir sub", "mkdir a", "mkdir a/b", "mkdir a/b/c", &format!("write {} sub/f", host.display())]
            .map(String::from),
    );
    assert_e2fsck_clean(&image);
    image
}

/// Expands "@/x" to IMAGE:/x (or to MOUNT/x for GNU), "@:" to the bare IMAGE:, and
/// "%x" to the host path DIR/x.
fn expand(args: &[&str], image_or_mount: &str, bare_image: bool, host: &Path) -> Vec<String> {
    args.iter()
        .map(|a| {
            if let Some(rest) = a.strip_prefix("@:") {
                format!("{image_or_mount}{}{rest}", if bare_image { ":" } else { "" })
            } else if let Some(rest) = a.strip_prefix('@') {
                format!("{image_or_mount}{}{rest}", if bare_image { ":" } else { "" })
            } else if let Some(rest) = a.strip_prefix('%') {
                host.join(rest).display().to_string()
            } else {
                a.to_string()
            }
        })
        .collect()
}

/// What GNU coreutils say about the same operands on a kernel mount.
enum Gnu {
    /// GNU fails too; its message ends with this errno text, which uext4 must print.
    FailsWith(&'static str),
    /// GNU fails too (with a refusal of its own words).
    Refuses,
    /// GNU acts on the operands it can before failing: no comparison.
    Differs,
}

#[test]
fn refused_operands_leave_the_image_byte_for_byte() {
    if !oracles(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = base_image(dir.path());
    // Symlinks for operands whose trailing '/' goes through them.
    debugfs_w(&image, &["symlink flink sub/f", "symlink dlink a", "symlink loop loop"].map(String::from));
    let img = image.display().to_string();
    let host = dir.path();
    fs::write(host.join("h1"), b"host one\n").unwrap();
    fs::write(host.join("h2"), b"host two\n").unwrap();
    fs::create_dir(host.join("x")).unwrap();
    fs::write(host.join("x/f"), b"a second f\n").unwrap();
    let long = "n".repeat(256);
    let long_path = format!("@/{long}");
    let long_in_sub = format!("@/sub/{long}");
    // A twin for GNU coreutils on the kernel's mount of the same tree.
    let twin = dir.path().join("twin.img");
    fs::copy(&image, &twin).unwrap();
    let mount = KernelMount::new(&twin, "");
    let mnt = mount.dir.display().to_string();
    let before = fs::read(&image).unwrap();
    use Gnu::*;
    let cases: Vec<(Vec<&str>, Vec<&str>, Gnu)> = vec![
        (vec!["rm", "-r", "@/."], vec!["refusing to remove '.' or '..'", "@/.'"], Refuses),
        (vec!["rm", "-r", "@/sub/.."], vec!["refusing to remove '.' or '..'", "@/sub/..'"], Refuses),
        (vec!["rm", "-r", "@/a/b/../.."], vec!["refusing to remove '.' or '..'"], Refuses),
        (vec!["rm", "-r", "@/sub/."], vec!["refusing to remove '.' or '..'"], Refuses),
        // GNU would empty the mount: its --preserve-root knows only the host's root.
        (vec!["rm", "-rf", "@/"], vec!["root", "preserve-root"], Differs),
        (vec!["rm", "-r", "@:"], vec!["root"], Differs),
        (vec!["rm", "-r", "@/a", "@/."], vec!["refusing to remove '.' or '..'", "nothing was changed"], Differs),
        (vec!["rm", "@/a"], vec!["cannot remove '@/a'"], FailsWith("Is a directory")),
        (vec!["rm", "@/sub/f", "@/missing"], vec!["cannot remove '@/missing'"], Differs),
        (vec!["rm", "@/sub/f/x"], vec!["cannot remove '@/sub/f/x'"], FailsWith("Not a directory")),
        (vec!["rm", &long_in_sub], vec!["cannot remove"], FailsWith("File name too long")),
        (vec!["mkdir", "@/new", "@/a/."], vec!["cannot create directory '@/a/.'"], Differs),
        (vec!["mkdir", "@/a/."], vec!["cannot create directory '@/a/.'"], FailsWith("File exists")),
        (vec!["mkdir", "@/a/.."], vec!["cannot create directory"], FailsWith("File exists")),
        (vec!["mkdir", "@/"], vec!["cannot create directory"], FailsWith("File exists")),
        (vec!["mkdir", "@/nope/."], vec!["cannot create directory"], FailsWith("No such file or directory")),
        (vec!["mkdir", &long_path], vec!["cannot create directory"], FailsWith("File name too long")),
        (vec!["mkdir", "@/sub/f/x"], vec!["cannot create directory '@/sub/f/x'"], FailsWith("Not a directory")),
        (vec!["mv", "@/.", "@/x"], vec!["cannot move '@/.' to '@/x'"], FailsWith("Device or resource busy")),
        (vec!["mv", "@/a/..", "@/x"], vec!["cannot move"], FailsWith("Device or resource busy")),
        (vec!["mv", "@/sub/f", &long_path], vec!["cannot move '@/sub/f' to"], FailsWith("File name too long")),
        (vec!["mv", "@/missing", "@/x"], vec!["cannot move '@/missing'"], FailsWith("No such file or directory")),
        (vec!["mv", "@/a", "@/a/b/c"], vec!["cannot move '@/a' to a subdirectory of itself"], Refuses),
        (vec!["mv", "@/a/b", "@/sub/f"], vec!["cannot move '@/a/b' to '@/sub/f': Not a directory"], Refuses),
        (vec!["ln", "@/a", "@/alink"], vec!["hard link not allowed for directory"], Refuses),
        (
            vec!["ln", "-s", "anything", &long_path],
            vec!["failed to create symbolic link"],
            FailsWith("File name too long"),
        ),
        (vec!["ln", "-s", "anything", "@/sub/f"], vec!["'@/sub/f'"], FailsWith("File exists")),
        (vec!["truncate", "-s", "0", "@/sub/f", "@/a"], vec!["cannot open '@/a' for writing"], Differs),
        (vec!["truncate", "-s", "0", "@/a"], vec!["cannot open '@/a' for writing"], FailsWith("Is a directory")),
        (vec!["chmod", "700", "@/sub/f", "@/missing"], vec!["cannot access '@/missing'"], Differs),
        (vec!["chmod", "700", "@/missing"], vec!["cannot access '@/missing'"], FailsWith("No such file or directory")),
        // (uid_t)-1 means "leave it" to chown(2): not an owner.
        (vec!["chown", "4294967295", "@/sub/f"], vec!["invalid owner"], Refuses),
        (vec!["chown", "1:1", "@/a/../missing"], vec!["'@/a/../missing'"], FailsWith("No such file or directory")),
        (vec!["setfattr", "-n", "user.x", "-v", "1", "@/sub/f", "@/sub/f/"], vec!["'@/sub/f/'"], Differs),
        (vec!["cp", "%h1", &long_path], vec!["cp:"], FailsWith("File name too long")),
        (vec!["cp", "%h1", "%missing", "@/a"], vec!["cannot stat"], Differs),
        (vec!["cp", "%h1", "%h2", "@/sub/f"], vec!["'@/sub/f'"], FailsWith("Not a directory")),
        (vec!["cp", "%h1", "@/nodir/"], vec!["'@/nodir/'"], FailsWith("Not a directory")),
        (vec!["cp", "-r", "%..", "@/a"], vec!["no name of its own"], Differs),
        // A trailing '/' follows a final symlink, to a directory or ENOTDIR;
        // the link's own entry is never removed or renamed through it.
        (vec!["rm", "@/flink/"], vec!["cannot remove '@/flink/'"], FailsWith("Not a directory")),
        (vec!["rm", "@/dlink/"], vec!["cannot remove '@/dlink/'"], FailsWith("Is a directory")),
        // GNU would empty /a through the link, then fail on the link.
        (vec!["rm", "-r", "@/dlink/"], vec!["cannot remove '@/dlink/'", "Not a directory"], Differs),
        (vec!["cat", "@/flink/"], vec!["'@/flink/'"], FailsWith("Not a directory")),
        (vec!["ls", "@/loop/"], vec!["'@/loop/'"], FailsWith("Too many levels of symbolic links")),
        (vec!["ln", "-s", "zz", "@/new/"], vec!["'@/new/'"], FailsWith("No such file or directory")),
        (vec!["mv", "@/dlink/", "@/x"], vec!["cannot move '@/dlink/'"], FailsWith("Not a directory")),
        (vec!["mv", "@/flink/", "@/x"], vec!["'@/flink/'"], FailsWith("Not a directory")),
        // From one image into another (or the same): said so, not "cannot stat".
        (vec!["cp", "-r", "@/a", "@/acopy"], vec!["copying from an image into an image is not supported"], Differs),
        // Copy-out of a directory without -r names the source, as GNU cp does.
        (vec!["cp", "@/a", "%cpout"], vec!["-r not specified; omitting directory '@/a'"], Refuses),
        // GNU cp would overwrite; uext4's copy-in never does.
        (vec!["cp", "%h1", "%x/f", "@/sub/."], vec!["cannot copy", "into '@/sub/.': File exists"], Differs),
    ];
    let mut gnu_compared = 0;
    for (args, fragments, gnu) in &cases {
        let ours = expand(args, &img, true, host);
        let out = uext4_out(&ours);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "uext4 {ours:?} should fail: {stderr}");
        for f in fragments {
            let f = f.replace('@', &format!("{img}:"));
            assert!(stderr.contains(&f), "uext4 {ours:?}: {stderr:?} does not say {f:?}");
        }
        assert!(fs::read(&image).unwrap() == before, "uext4 {ours:?} changed the image: {stderr}");
        // GNU coreutils on the kernel's mount of the same tree.
        if matches!(gnu, Differs) {
            continue;
        }
        let theirs = expand(args, &mnt, false, host);
        let g = Command::new(&theirs[0]).args(&theirs[1..]).output().unwrap();
        let gerr = String::from_utf8_lossy(&g.stderr).into_owned();
        assert!(!g.status.success(), "GNU {theirs:?} succeeded where uext4 refused ({stderr})");
        if let FailsWith(errno) = gnu {
            assert!(gerr.trim_end().ends_with(errno), "GNU {theirs:?} said {gerr:?}, not {errno}");
            assert!(stderr.contains(errno), "uext4 {ours:?} said {stderr:?}; GNU says {errno}");
            gnu_compared += 1;
        }
    }
    assert!(gnu_compared >= 20, "only {gnu_compared} errno texts compared with GNU's");
    drop(mount);
    assert_e2fsck_clean(&image);
    // debugfs still sees the whole tree.
    let listing = run(Command::new("debugfs").arg("-R").arg("ls -p /a/b").arg(&image));
    assert!(listing.contains("/c/"), "{listing}");
    let cat = run(Command::new("debugfs").arg("-R").arg("cat /sub/f").arg(&image));
    assert!(cat.contains("the file f"), "{cat}");
}

#[test]
fn dot_operands_act_as_coreutils_act_on_a_kernel_mount() {
    if !oracles(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = base_image(dir.path());
    let twin = dir.path().join("twin.img");
    fs::copy(&image, &twin).unwrap();
    let img = image.display().to_string();
    let host = dir.path();
    fs::write(host.join("h1"), b"host one\n").unwrap();
    // The same script for uext4 on the image and for GNU coreutils on the twin's kernel mount.
    let script: Vec<Vec<&str>> = vec![
        vec!["mv", "@/sub/f", "@/."],
        vec!["mv", "@/f", "@/a/b/.."],
        vec!["mkdir", "-p", "@/a/.", "@/a/../n/m"],
        vec!["chmod", "700", "@/a/b/.."],
        vec!["cp", "-p", "%h1", "@/a/b/c/."],
        vec!["ln", "@/a/f", "@/."],
        vec!["ln", "-s", "target", "@/n/."],
        vec!["mv", "@/a/b/c", "@/sub/"],
        vec!["rm", "-r", "@/a/b/../b"],
        vec!["chown", "7:8", "@/sub/c/h1", "@/n/./m"],
    ];
    let mount = KernelMount::new(&twin, "");
    let mnt = mount.dir.display().to_string();
    for step in &script {
        let ours = expand(step, &img, true, host);
        let out = uext4_out(&ours);
        assert!(out.status.success(), "uext4 {ours:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_e2fsck_clean(&image);
        let theirs = expand(step, &mnt, false, host);
        run(Command::new(&theirs[0]).args(&theirs[1..]));
    }
    let gnu_tree = tree_listing(&mount.dir);
    drop(mount);
    assert_e2fsck_clean(&twin);
    let ours = KernelMount::new(&image, "ro");
    let our_tree = tree_listing(&ours.dir);
    assert_eq!(our_tree, gnu_tree, "uext4's tree (left) differs from GNU coreutils' on the kernel (right)");
    assert!(our_tree.iter().any(|l| l.starts_with("n/target ")), "{our_tree:#?}");
    drop(ours);
    // Copying out "DIR/." puts DIR's contents into an existing host directory, as cp does.
    let out_dir = host.join("out");
    fs::create_dir(&out_dir).unwrap();
    let o = uext4_out(&["cp".into(), "-r".into(), format!("{img}:/n/."), out_dir.display().to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out_dir.join("m").is_dir() && fs::symlink_metadata(out_dir.join("target")).unwrap().is_symlink());
    let o = uext4_out(&["cp".into(), "-r".into(), format!("{img}:/n/.."), out_dir.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "copying '..' into a directory names nothing there");
    assert_e2fsck_clean(&image);
}

/// `info`'s "Key: value" lines.
fn fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect()
}

/// Fields uext4 info and dumpe2fs -h print alike (times are printed differently).
const SHARED_FIELDS: &[&str] = &[
    "Filesystem volume name",
    "Filesystem UUID",
    "Filesystem magic number",
    "Filesystem features",
    "Inode count",
    "Block count",
    "Reserved block count",
    "Free blocks",
    "Free inodes",
    "First block",
    "Block size",
    "Group descriptor size",
    "Reserved GDT blocks",
    "Blocks per group",
    "Inodes per group",
    "Flex block group size",
    "Mount count",
    "First inode",
    "Inode size",
    "Required extra isize",
    "Desired extra isize",
    "Journal inode",
    "Default directory hash",
    "Directory Hash Seed",
    "Checksum type",
    "Checksum",
];

fn assert_info_matches_dumpe2fs(image: &Path, dumpe2fs_args: &[&str]) -> String {
    let out = uext4_out(&["info".into(), image.display().to_string()]);
    let info = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "info {}: {info}{}", image.display(), String::from_utf8_lossy(&out.stderr));
    let dump = Command::new("dumpe2fs").args(dumpe2fs_args).arg(image).output().unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout).into_owned();
    let (ours, theirs) = (fields(&info), fields(&dump));
    for key in SHARED_FIELDS {
        let pick = |f: &[(String, String)]| f.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let (a, b) = (pick(&ours), pick(&theirs));
        assert!(a.is_some() && a == b, "{key}: uext4 info {a:?}, dumpe2fs {b:?} ({})", image.display());
    }
    info
}

#[test]
fn info_shows_what_it_can_of_images_it_cannot_open() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let host = d.join("f.host");
    fs::write(&host, b"kept\n").unwrap();

    // An incompat feature nobody knows: uext4 refuses the open, dumpe2fs needs -f.
    let unknown = d.join("unknown.img");
    mkfs(&unknown, "32M");
    debugfs_w(&unknown, &["feature FEATURE_I31".into()]);
    let before = fs::read(&unknown).unwrap();
    let info = assert_info_matches_dumpe2fs(&unknown, &["-f", "-h"]);
    assert!(
        info.lines().any(|l| l.starts_with("uext4 cannot open it:") && l.contains("FEATURE_I31")),
        "info does not name the refused feature:\n{info}"
    );
    assert!(fs::read(&unknown).unwrap() == before, "info changed the image");
    let ls = uext4_out(&["ls".into(), format!("{}:/", unknown.display())]);
    assert_eq!(ls.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&ls.stderr).contains("FEATURE_I31"));

    // A journal that needs recovery but whose superblock is gone.
    let journal = d.join("journal.img");
    mkfs(&journal, "32M");
    let bmap = run(Command::new("debugfs").arg("-R").arg("bmap <8> 0").arg(&journal));
    let jblock: u64 = bmap.lines().filter_map(|l| l.trim().parse().ok()).next().expect("journal block");
    debugfs_w(&journal, &["feature needs_recovery".into()]);
    let mut bytes = fs::read(&journal).unwrap();
    bytes[jblock as usize * 4096..(jblock as usize + 1) * 4096].fill(0);
    fs::write(&journal, &bytes).unwrap();
    let info = assert_info_matches_dumpe2fs(&journal, &["-h"]);
    assert!(
        info.lines().any(|l| l.starts_with("uext4 cannot open it:") && l.contains("journal")),
        "info does not name the journal:\n{info}"
    );
    assert!(fs::read(&journal).unwrap() == bytes, "info changed the image");

    // A descriptor checksum mismatch: opens, read-only, naming the group.
    let desc = d.join("desc.img");
    mkfs(&desc, "256M");
    debugfs_w(&desc, &["set_bg 1 checksum 0".into()]);
    let info = assert_info_matches_dumpe2fs(&desc, &["-h"]);
    assert!(
        info.lines().any(|l| l.starts_with("Read-only:") && l.contains("group 1") && l.contains("checksum")),
        "info does not say why the open is read-only:\n{info}"
    );
    let (code, findings) = e2fsck_findings(&desc);
    assert!(
        matches!(code, Some(0 | 4)) && findings.contains("Group descriptor 1 checksum"),
        "e2fsck {code:?}: {findings}"
    );

    // A superblock whose checksum does not match: dumpe2fs warns and prints it.
    let sb_csum = d.join("sb_csum.img");
    mkfs(&sb_csum, "32M");
    let mut bytes = fs::read(&sb_csum).unwrap();
    bytes[1024 + 0x3fc] ^= 0xff;
    fs::write(&sb_csum, &bytes).unwrap();
    let info = assert_info_matches_dumpe2fs(&sb_csum, &["-h"]);
    assert!(
        info.lines().any(|l| l.starts_with("uext4 cannot open it:") && l.contains("superblock checksum")),
        "info does not name the superblock checksum:\n{info}"
    );

    // No superblock at all: the one case info fails.
    let junk = d.join("junk.img");
    fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let out = uext4_out(&["info".into(), junk.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("magic"));
    let short = d.join("short.img");
    fs::write(&short, vec![0u8; 1500]).unwrap();
    let out = uext4_out(&["info".into(), short.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("too small"));
    let dump = Command::new("dumpe2fs").arg("-h").arg(&junk).output().unwrap();
    assert!(!dump.status.success(), "dumpe2fs reads no superblock there either");
}

#[test]
fn a_descriptor_checksum_mismatch_opens_read_only_as_the_kernel_mounts_it() {
    if !oracles(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("desc.img");
    mkfs(&image, "256M");
    let host = dir.path().join("f.host");
    fs::write(&host, b"readable still\n").unwrap();
    debugfs_w(&image, &["mkdir d".into(), format!("write {} d/f", host.display())]);
    // Alone: debugfs sets every descriptor's checksum when it wrote anything else.
    debugfs_w(&image, &["set_bg 1 checksum 0".into()]);
    let before = fs::read(&image).unwrap();
    let e2fsck_before = e2fsck_findings(&image);
    assert!(e2fsck_before.1.contains("Group descriptor 1 checksum"), "{}", e2fsck_before.1);

    // The kernel: a read-write mount fails, a read-only one works.
    let mnt = tempfile::tempdir().unwrap();
    let rw = Command::new("mount").args(["-t", "ext4", "-o", "loop"]).arg(&image).arg(mnt.path()).output().unwrap();
    if rw.status.success() {
        let _ = Command::new("umount").arg(mnt.path()).status();
        panic!("the kernel mounted a descriptor checksum mismatch read-write");
    }
    let kernel = KernelMount::new(&image, "ro");
    let kernel_names: Vec<String> = {
        let mut v: Vec<String> =
            fs::read_dir(&kernel.dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    let kernel_data = fs::read(kernel.dir.join("d/f")).unwrap();
    drop(kernel);

    let img = image.display().to_string();
    let ls = uext4_out(&["ls".into(), format!("{img}:/")]);
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
    let names: Vec<String> = String::from_utf8_lossy(&ls.stdout).lines().map(String::from).collect();
    assert_eq!(names, kernel_names);
    let cat = uext4_out(&["cat".into(), format!("{img}:/d/f")]);
    assert_eq!(cat.stdout, kernel_data);

    // Writes are refused, naming the group, and change nothing.
    for args in [vec!["mkdir", "@/x"], vec!["rm", "@/d/f"], vec!["cp", "%f.host", "@/g"]] {
        let args = expand(&args, &img, true, dir.path());
        let out = uext4_out(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "uext4 {args:?} wrote to an image the kernel mounts read-only only");
        assert!(stderr.contains("group 1") && stderr.contains("read-only"), "{stderr}");
    }
    assert!(fs::read(&image).unwrap() == before, "a refused write changed the image");
    assert_eq!(e2fsck_findings(&image), e2fsck_before);
}

#[test]
fn names_with_control_bytes_are_printed_escaped() {
    if !oracles(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("names.img");
    mkfs(&image, "32M");
    let evil = "evil\n\x1b[31mred\x07bell";
    let title = "d\x1b]0;title\x07";
    {
        use std::os::unix::ffi::OsStrExt;
        let k = KernelMount::new(&image, "");
        fs::write(k.dir.join(evil), b"x").unwrap();
        fs::create_dir(k.dir.join(title)).unwrap();
        fs::write(k.dir.join(title).join("in\rside"), b"y").unwrap();
        std::os::unix::fs::symlink("tgt\x1b[2J", k.dir.join("link\x08")).unwrap();
        fs::write(k.dir.join(std::ffi::OsStr::from_bytes(b"bad\xff\xfeutf8\xc2\x9b")), b"z").unwrap();
        run(Command::new("setfattr").args(["-n", "user.a\u{1b}b", "-v", "v"]).arg(k.dir.join(evil)));
    }
    assert_e2fsck_clean(&image);
    let img = image.display().to_string();
    let raw = |bytes: &[u8]| -> Option<usize> {
        // Line ends are uext4's own; anything else below 0x20, DEL, or a C1 control is raw.
        bytes.windows(2).position(|w| {
            (w[0] < 0x20 && w[0] != b'\n') || w[0] == 0x7f || (w[0] == 0xc2 && (0x80..0xa0).contains(&w[1]))
        })
    };
    let mut outputs = Vec::new();
    for args in [
        vec!["ls".to_string(), format!("{img}:/")],
        vec!["ls".into(), "-l".into(), "-a".into(), format!("{img}:/")],
        vec!["ls".into(), "-l".into(), format!("{img}:/{title}")],
        vec!["stat".into(), format!("{img}:/{evil}")],
        vec!["getfattr".into(), format!("{img}:/{evil}")],
        vec!["stat".into(), format!("{img}:/link\x08")],
    ] {
        let out = uext4_out(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            raw(&out.stdout),
            None,
            "{args:?} printed a raw control byte: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let ls = &outputs[0];
    assert_eq!(ls.lines().count(), 5, "one line per entry (lost+found and four more): {ls:?}");
    for shown in ["evil\\n\\033[31mred\\abell", "d\\033]0;title\\a", "link\\b", "bad\\377\\376utf8\\302\\233"] {
        assert!(ls.lines().any(|l| l == shown), "{shown} missing from {ls:?}");
    }
    assert!(outputs[1].contains("link\\b -> tgt\\033[2J"), "{}", outputs[1]);
    assert!(outputs[2].contains("in\\rside"), "{}", outputs[2]);
    assert!(outputs[4].contains("user.a\\033b"), "{}", outputs[4]);
    // Failures quoting such a name escape it too.
    let out = uext4_out(&["cat".into(), format!("{img}:/{title}")]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(raw(&out.stderr), None, "{:?}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("d\\033]0;title\\a"));
    assert_e2fsck_clean(&image);
}

/// `uext4 mkfs` over an existing image with options it refuses only after
/// planning the whole layout (a label too long, no room for a journal at a big
/// block size) leaves the image byte for byte as it was, e2fsck-clean.
#[test]
fn a_refused_mkfs_leaves_the_image_it_would_have_replaced() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = base_image(dir.path());
    let before = fs::read(&image).unwrap();
    let img = image.to_str().unwrap().to_string();
    for (extra, why) in
        [(vec!["-L", "12345678901234567"], "longer than 16 bytes"), (vec!["-b", "65536"], "too small for a journal")]
    {
        let mut args: Vec<String> = ["mkfs", "-s", "64M"].map(String::from).to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        args.push(img.clone());
        let out = uext4_out(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(why), "{args:?}: {stderr}");
        assert!(fs::read(&image).unwrap() == before, "{args:?} changed the image before refusing");
    }
    assert_e2fsck_clean(&image);
}

/// Commands refused part-way, after the image was opened for writing (an
/// attribute that no longer fits its block, a copy larger than the free
/// space), leave it byte for byte: the close wrote the superblock's write time
/// and a journal transaction for it whatever happened.
#[test]
fn commands_refused_part_way_leave_the_image_byte_for_byte() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    let status = Command::new("mkfs.ext4").args(["-q", "-F", "-b", "1024"]).arg(&image).arg("8M").status().unwrap();
    assert!(status.success());
    let img = image.to_str().unwrap().to_string();
    let host = dir.path().join("h");
    fs::write(&host, "hi").unwrap();
    let big = dir.path().join("big");
    fs::write(&big, vec![7u8; 9 << 20]).unwrap();
    let set = |name: &str, len: usize| -> Vec<String> {
        ["setfattr", "-n", name, "-v", &"a".repeat(len), &format!("{img}:/f")].map(String::from).to_vec()
    };
    assert!(uext4_out(&["cp".into(), host.display().to_string(), format!("{img}:/f")]).status.success());
    assert!(uext4_out(&set("user.a", 900)).status.success());
    let before = fs::read(&image).unwrap();
    for args in [set("user.b", 300), vec!["cp".into(), big.display().to_string(), format!("{img}:/big")]] {
        let out = uext4_out(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(1) && stderr.contains("No space left"), "{:?}: {stderr}", &args[..2]);
        if args[0] == "setfattr" {
            assert!(fs::read(&image).unwrap() == before, "a refused setfattr changed the image");
        }
    }
    assert_e2fsck_clean(&image);
}

/// A file whose size lies past the largest file (damage the kernel refuses
/// at iget) is refused by name, quickly (copying it out spun forever), and a
/// long listing of its directory shows the other entries and exits 1, as GNU
/// ls does for an entry it cannot stat.
#[test]
fn a_file_sized_past_the_largest_is_refused_by_name_and_listed_around() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    let status = Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096"]).arg(&image).arg("64M").status().unwrap();
    assert!(status.success());
    let img = image.to_str().unwrap().to_string();
    let host = dir.path().join("h");
    fs::write(&host, "hi").unwrap();
    assert!(uext4_out(&["cp".into(), host.display().to_string(), format!("{img}:/f")]).status.success());
    debugfs_w(&image, &["sif /f size 0xffffffffffff".into()]);
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let started = std::time::Instant::now();
    let out = uext4_out(&["cp".into(), format!("{img}:/f"), out_dir.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && stderr.contains("past the largest file size"), "{out:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "cp took {:?}", started.elapsed());
    let out = uext4_out(&["ls".into(), "-l".into(), format!("{img}:/")]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.code() == Some(1), "{out:?}");
    assert!(stdout.contains("lost+found") && stderr.contains("cannot access f"), "{stdout}\n{stderr}");
}

/// A symlink whose target is empty (damage: no host symlink can hold it) is
/// refused naming the image's inode; it was reported as the host path "No
/// such file or directory". The copy goes on with the rest and exits 1, as
/// GNU cp -r does (it stopped there).
#[test]
fn a_symlink_with_an_empty_target_is_refused_naming_its_inode() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("img");
    let status = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image).arg("16M").status().unwrap();
    assert!(status.success());
    let host = dir.path().join("z");
    fs::write(&host, "after the link").unwrap();
    debugfs_w(
        &image,
        &["symlink a_link target".into(), "sif /a_link size 0".into(), format!("write {} z_file", host.display())],
    );
    let out_dir = dir.path().join("out");
    let out = uext4_out(&["cp".into(), "-r".into(), format!("{}:/", image.display()), out_dir.display().to_string()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && stderr.contains("symlink with an empty target (inode"), "{out:?}");
    assert_eq!(fs::read_to_string(out_dir.join("z_file")).unwrap(), "after the link", "{stderr}");
}

/// A file of 1 TiB whose data is its first 16 bytes copies out as that data
/// and a hole: reading the hole as zeros would take many minutes, which the
/// 60 s limit turns into a failure rather than a hang.
#[test]
fn a_huge_sparse_file_copies_out_as_its_data() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("sparse.img");
    mkfs(&image, "64M");
    let img = image.to_str().unwrap();
    let host = dir.path().join("head");
    fs::write(&host, b"the first bytes\n").unwrap();
    run(uext4().args(["cp", host.to_str().unwrap(), &format!("{img}:/f")]));
    run(uext4().args(["truncate", "-s", "1T", &format!("{img}:/f")]));
    let out = dir.path().join("out");
    let status = Command::new("timeout")
        .args(["60", env!("CARGO_BIN_EXE_uext4"), "cp", &format!("{img}:/f")])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "cp out of a 1 TiB sparse file: {status}");
    use std::os::unix::fs::MetadataExt;
    let md = fs::metadata(&out).unwrap();
    assert_eq!(md.len(), 1 << 40);
    assert!(md.blocks() < 1024, "the copy is not sparse: {} blocks", md.blocks());
    let mut head = vec![0u8; 16];
    std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(&out).unwrap(), &mut head, 0).unwrap();
    assert_eq!(head, b"the first bytes\n");
    assert_e2fsck_clean(&image);
}

/// A reading command whose reader goes away (`| head -c 1`) ends as cat and
/// ls end, by SIGPIPE (exit 141 through a shell) or having written all, never
/// with a panic (exit 101, "failed printing to stdout").
#[test]
fn reading_commands_end_quietly_when_their_reader_goes_away() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = base_image(dir.path());
    let bin = env!("CARGO_BIN_EXE_uext4");
    for cmd in ["stat", "ls -l", "cat"] {
        let operand = if cmd == "cat" { "/sub/f" } else { "/sub" };
        for _ in 0..20 {
            let script =
                format!("set -o pipefail; {bin} {cmd} '{}:{operand}' 2>&1 | head -c 1 >/dev/null", image.display());
            let code = Command::new("bash").args(["-c", &script]).status().unwrap().code();
            assert!(matches!(code, Some(0) | Some(141)), "uext4 {cmd} into a closed pipe: exit {code:?}");
        }
    }
}

/// `rm -r A A/x` and `rm -r B B`: the first operand takes the second with it;
/// GNU rm then says ENOENT for the second and exits 1, and so does uext4,
/// having removed the first (the kernel's mount of a twin agrees on the tree).
#[test]
fn rm_of_an_operand_an_earlier_one_removed_says_enoent() {
    if !oracles(true) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = base_image(dir.path());
    let twin = dir.path().join("twin.img");
    fs::copy(&image, &twin).unwrap();
    let img = image.display().to_string();
    let mount = KernelMount::new(&twin, "");
    for (ours, theirs) in [(["@/a", "@/a/b"], ["a", "a/b"]), (["@/sub", "@/sub"], ["sub", "sub"])] {
        let args: Vec<String> = ["rm".to_string(), "-r".to_string()]
            .into_iter()
            .chain(ours.iter().map(|o| o.replace('@', &format!("{img}:"))))
            .collect();
        let out = uext4_out(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains("No such file or directory"), "{args:?}: {stderr}");
        let g = Command::new("rm").arg("-r").args(theirs.iter().map(|t| mount.dir.join(t))).output().unwrap();
        assert_eq!(g.status.code(), Some(1), "GNU rm -r {theirs:?}");
    }
    let listing = run(Command::new("debugfs").arg("-R").arg("ls -p /").arg(&image));
    assert!(!listing.contains("/a/") && !listing.contains("/sub/"), "{listing}");
    let mut gnu: Vec<String> =
        fs::read_dir(&mount.dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    gnu.sort();
    assert_eq!(gnu, ["lost+found"]);
    drop(mount);
    assert_e2fsck_clean(&image);
}

/// `IMAGE:path` without the leading '/' is a path from the root (as scp takes
/// one) when IMAGE exists: `ls IMG:sub` lists /sub, `cp F IMG:sub/g` copies in
/// (debugfs reads it), `cp IMG:sub/f F` copies out. An argument that exists as
/// a whole stays a host file (an image's own name may hold a ':').
#[test]
fn an_image_path_without_its_leading_slash_starts_at_the_root() {
    if !oracles(false) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = base_image(dir.path());
    let img = image.display().to_string();
    let listed = run(uext4().args(["ls", &format!("{img}:sub")]));
    assert_eq!(listed.trim(), "f");
    let host = dir.path().join("g.host");
    fs::write(&host, b"copied in\n").unwrap();
    run(uext4().args(["cp", host.to_str().unwrap(), &format!("{img}:sub/g")]));
    let cat = run(Command::new("debugfs").arg("-R").arg("cat /sub/g").arg(&image));
    assert!(cat.contains("copied in"), "{cat}");
    let out = dir.path().join("f.out");
    run(uext4().args(["cp", &format!("{img}:sub/f"), out.to_str().unwrap()]));
    assert_eq!(fs::read(&out).unwrap(), b"the file f\n");
    assert_e2fsck_clean(&image);
}
