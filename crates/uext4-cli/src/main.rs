//! `uext4`: the command-line face of the uext4 engine.
//!
//! Every subcommand names files inside an image as `IMAGE:/path` (as e2tools' e2cp
//! does). Exit status is 0 on success and 1 with a message on stderr (one line per
//! refused operand), every byte from an image in it escaped (see `show`).

mod cmd_cp;
mod cmd_edit;
mod cmd_info;
mod cmd_ls;
mod cmd_mkfs;
mod cmd_mount;
mod cmd_put;
mod cmd_stats;
mod demo;
mod fuse;
mod put_parallel;
mod show;
mod target;

use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "uext4", version, about = "Read, write and inspect ext4 images in user space")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The filesystem starts this many bytes into the image (K, M, G suffixes allowed)
    #[arg(long, global = true, value_parser = cmd_mkfs::parse_size, conflicts_with = "partition")]
    offset: Option<u64>,
    /// The filesystem is partition N (from 1) of the image's MBR or GPT table
    #[arg(long, global = true)]
    partition: Option<u32>,
}

#[derive(Subcommand)]
enum Command {
    /// Show the superblock and feature summary, like `dumpe2fs -h`
    Info(cmd_info::InfoArgs),
    /// List a directory inside an image
    Ls(cmd_ls::LsArgs),
    /// Write a file's contents from an image to standard output
    Cat(cmd_ls::CatArgs),
    /// Show an inode's fields, its block mapping (extents, block map or inline) and xattrs
    Stat(cmd_ls::StatArgs),
    /// Copy files out of an image (cp -r IMAGE:/path HOSTDIR) or into it (cp -r HOSTPATH... IMAGE:/path)
    Cp(cmd_cp::CpArgs),
    /// Histograms of directory and file sizes, and how many would fit inline
    Stats(cmd_stats::StatsArgs),
    /// Create a new ext4 image
    Mkfs(cmd_mkfs::MkfsArgs),
    /// Make directories inside an image
    Mkdir(cmd_edit::MkdirArgs),
    /// Remove files (and with -r, directories) inside an image
    Rm(cmd_edit::RmArgs),
    /// Rename or move inside an image
    Mv(cmd_edit::MvArgs),
    /// Make a hard link, or with -s a symbolic link, inside an image
    Ln(cmd_edit::LnArgs),
    /// Set a file's size
    Truncate(cmd_edit::TruncateArgs),
    /// Change permission bits (octal)
    Chmod(cmd_edit::ChmodArgs),
    /// Change owner (numeric UID[:GID])
    Chown(cmd_edit::ChownArgs),
    /// Set (-n NAME -v VALUE) or remove (-x NAME) an extended attribute
    Setfattr(cmd_edit::SetfattrArgs),
    /// Show extended attributes
    Getfattr(cmd_edit::GetfattrArgs),
    /// Build a fresh image in a temporary directory, fill it, check it with e2fsck
    Demo(demo::DemoArgs),
    /// Mount an image through FUSE (multi-threaded; detaches unless --foreground)
    Mount(cmd_mount::MountArgs),
    /// Unmount a uext4 mount, waiting until everything is written back
    Umount(cmd_mount::UmountArgs),
    /// Commit everything written through a uext4 mount (sync(2) does not reach FUSE servers)
    Sync(cmd_mount::SyncArgs),
    /// Show the tunables of a uext4 mount, or change the runtime ones (key=value)
    Tune(cmd_mount::TuneArgs),
    /// Run workloads side by side on uext4, the kernel's ext4 and fuse2fs (`bench list` shows them)
    Bench(uext4_bench::BenchArgs),
}

/// The FUSE mount helper convention: mount(8) runs mount.fuse3 for a
/// `fuse.uext4` line, and mount.fuse3 runs `uext4 IMAGE DIR -o OPTS` (and a
/// `mount.fuse.uext4` link to this binary is run as `mount.fuse.uext4 IMAGE
/// DIR -o OPTS [-t TYPE] [-n] [-s] [-v]`): both become `uext4 mount IMAGE DIR
/// -o OPTS`. A first operand that names a subcommand or an option is left for
/// clap, so `uext4 ls IMG` keeps its meaning; an image file called `ls` must be
/// given as `./ls`.
/// A typo of a subcommand followed by operands stays clap's error, as the
/// convention's second operand must be a directory.
fn helper_convention(args: Vec<OsString>) -> Vec<OsString> {
    let as_helper = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|name| name.to_string_lossy().starts_with("mount."));
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    let names_subcommand = |a: &str| Cli::command().find_subcommand(a).is_some() || a == "help";
    let on_dir = args.get(2).is_some_and(|d| std::path::Path::new(d).is_dir());
    let operands = match &first {
        Some(a) if as_helper || (!a.starts_with('-') && !names_subcommand(a)) => on_dir,
        _ => false,
    };
    if !operands {
        return args;
    }
    let mut out: Vec<OsString> = vec!["uext4".into(), "mount".into()];
    let mut rest = args.into_iter().skip(1);
    while let Some(a) = rest.next() {
        match a.to_str() {
            // mount(8)'s helper flags: the type is known, there is no mtab to
            // skip, and sloppy or verbose change nothing here.
            Some("-t") => {
                rest.next();
            }
            Some("-n" | "-s" | "-v") => {}
            _ => out.push(a),
        }
    }
    out
}

/// SOURCE_DATE_EPOCH, the reproducible-builds convention: when set, every
/// time uext4 stamps is that second (see `uext4::clock`).
fn honour_source_date_epoch() -> std::result::Result<(), String> {
    let Some(value) = std::env::var_os("SOURCE_DATE_EPOCH") else { return Ok(()) };
    let text = value.to_string_lossy();
    let seconds: i64 =
        text.trim().parse().map_err(|_| format!("SOURCE_DATE_EPOCH={text}: want a number of seconds since 1970"))?;
    uext4::clock::set_fixed_time(Some(seconds));
    Ok(())
}

fn main() -> ExitCode {
    if let Err(e) = honour_source_date_epoch() {
        eprintln!("uext4: {e}");
        return ExitCode::from(1);
    }
    let cli = Cli::parse_from(helper_convention(std::env::args_os().collect()));
    target::set_region(match (cli.offset, cli.partition) {
        (Some(offset), _) => uext4::dev::Region::Offset(offset),
        (None, Some(n)) => uext4::dev::Region::Partition(n),
        (None, None) => uext4::dev::Region::Whole,
    });
    // The reading commands end quietly when what reads their output goes away
    // (`uext4 ls -l IMG:/ | head`), as cat and ls do: SIGPIPE's default action.
    // Rust ignores SIGPIPE, and a print into a closed pipe then panics. Commands
    // that change an image or serve a mount keep ignoring it: they never die
    // between two writes for want of a reader.
    if matches!(
        cli.command,
        Command::Info(_)
            | Command::Ls(_)
            | Command::Cat(_)
            | Command::Stat(_)
            | Command::Stats(_)
            | Command::Getfattr(_)
    ) {
        // SAFETY: restores a signal's default action before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    report_errors_panic_briefly();
    // errors=panic (the image's choice, or -o errors=panic) ends the command
    // where the error was met: the library has recorded and reported the
    // error and turned read-only, so this only says why the command stopped.
    let run = std::panic::AssertUnwindSafe(|| run_command(cli.command));
    let result = match std::panic::catch_unwind(run) {
        Ok(result) => result,
        Err(payload) if uext4::is_errors_panic(&panic_text(payload.as_ref())) => {
            eprintln!("uext4: stopped by errors=panic (the error is recorded in the superblock); run e2fsck -f");
            return ExitCode::from(1);
        }
        Err(payload) => std::panic::resume_unwind(payload),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.to_string().contains("Broken pipe") {
                return ExitCode::SUCCESS;
            }
            for line in &e.lines {
                eprintln!("uext4: {}", show::escape(line.as_bytes()));
            }
            ExitCode::from(1)
        }
    }
}

/// A panic's message, when it carries one.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    match (payload.downcast_ref::<String>(), payload.downcast_ref::<&str>()) {
        (Some(s), _) => s.clone(),
        (None, Some(s)) => s.to_string(),
        (None, None) => String::new(),
    }
}

/// An errors=panic stop is the image's choice, not a bug: no "thread panicked"
/// report or backtrace hint for it (`main` says why the command stopped).
/// Every other panic is reported as Rust reports it.
fn report_errors_panic_briefly() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !uext4::is_errors_panic(&panic_text(info.payload())) {
            default(info);
        }
    }));
}

fn run_command(command: Command) -> show::CliResult<()> {
    match command {
        Command::Info(a) => cmd_info::run(a),
        Command::Ls(a) => cmd_ls::run_ls(a),
        Command::Cat(a) => cmd_ls::run_cat(a),
        Command::Stat(a) => cmd_ls::run_stat(a),
        Command::Cp(a) => cmd_cp::run(a),
        Command::Stats(a) => cmd_stats::run(a).map_err(Into::into),
        Command::Mkfs(a) => cmd_mkfs::run(a).map_err(Into::into),
        Command::Mkdir(a) => cmd_edit::mkdir(a),
        Command::Rm(a) => cmd_edit::rm(a),
        Command::Mv(a) => cmd_edit::mv(a),
        Command::Ln(a) => cmd_edit::ln(a),
        Command::Truncate(a) => cmd_edit::truncate(a),
        Command::Chmod(a) => cmd_edit::chmod(a),
        Command::Chown(a) => cmd_edit::chown(a),
        Command::Setfattr(a) => cmd_edit::setfattr(a),
        Command::Getfattr(a) => cmd_edit::getfattr(a),
        Command::Demo(a) => demo::run(a).map_err(Into::into),
        Command::Mount(a) => cmd_mount::mount(a).map_err(Into::into),
        Command::Umount(a) => cmd_mount::umount(a),
        Command::Sync(a) => cmd_mount::sync(a).map_err(Into::into),
        Command::Tune(a) => cmd_mount::tune(a).map_err(Into::into),
        Command::Bench(a) => uext4_bench::run(&a).map_err(|e| show::Failure::from(uext4::Error::Invalid(e.0))),
    }
}
