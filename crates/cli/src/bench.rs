pub fn main(_a: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
