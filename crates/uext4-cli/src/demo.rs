//! `uext4 demo`: the main job on a fresh machine — make an image in a temporary
//! directory, look inside it, check it with e2fsck, and say what happened.

use uext4::Result;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Keep the temporary directory instead of deleting it
    #[arg(long)]
    keep: bool,
}

pub fn run(_a: DemoArgs) -> Result<()> {
    Err(uext4::Error::unsupported("demo is being written"))
}
