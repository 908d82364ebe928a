//! Installs that run beside the build: a thread a step, its commands' output in a log
//! file under the target directory, so that cargo's own output stays readable.

use std::{
    fs::{self, File},
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::{self, JoinHandle},
    time::Instant,
};

use anyhow::{Context, Result, anyhow, bail};

use crate::util::{show, target_dir};

/// Lines of the log shown when a step fails.
const TAIL_LINES: usize = 20;

/// Where a background step's commands write.
#[derive(Debug)]
pub struct Log {
    file: File,
}

impl Log {
    /// Runs `c` with its output in the log; a non-zero exit is an error.
    pub fn run(&mut self, c: &mut Command) -> Result<()> {
        let line = show(c);
        writeln!(self.file, "{line}").context("cannot write the setup log")?;
        let status = c
            .stdin(Stdio::null())
            .stdout(self.file.try_clone().context("cannot share the setup log")?)
            .stderr(self.file.try_clone().context("cannot share the setup log")?)
            .status()
            .with_context(|| format!("cannot start `{line}`"))?;
        if !status.success() {
            bail!("`{}` failed: {status}", line.trim_start_matches("$ "));
        }
        Ok(())
    }
}

/// A step running in its own thread.
#[derive(Debug)]
pub struct Job {
    name: &'static str,
    log: PathBuf,
    started: Instant,
    thread: JoinHandle<Result<()>>,
}

impl Job {
    /// Starts `work` (what installs `name`) and says so.
    pub fn spawn(
        name: &'static str,
        what: &str,
        work: impl FnOnce(&mut Log) -> Result<()> + Send + 'static,
    ) -> Result<Job> {
        let dir = target_dir().join("setup");
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let log = dir.join(format!("{name}.log"));
        let file = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        println!("setup: {name}: installing {what} in the background (log: {})", log.display());
        let thread = thread::spawn(move || work(&mut Log { file }));
        Ok(Job { name, log, started: Instant::now(), thread })
    }

    /// Waits for the step and prints its `setup:` line; on failure also the log's tail
    /// and the error, which says what to do by hand.
    pub fn join(self) -> Result<()> {
        let result = self.thread.join().unwrap_or_else(|_| Err(anyhow!("the install thread panicked")));
        match result {
            Ok(()) => {
                println!("setup: {}: installed ({} s)", self.name, self.started.elapsed().as_secs());
                Ok(())
            }
            Err(e) => {
                println!("setup: {}: FAILED", self.name);
                eprintln!("last lines of {}:\n{}", self.log.display(), tail(&self.log));
                eprintln!("{e:#}");
                bail!("setup failed at step `{}`", self.name)
            }
        }
    }
}

fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step that fails names itself, as a foreground step does, and leaves what its
    /// command printed in its log.
    #[test]
    fn a_failed_step_is_named_and_its_output_kept_in_its_log() {
        let job = Job::spawn("xtask-test-failing-step", "nothing", |log| {
            log.run(Command::new("sh").args(["-c", "echo printed-by-the-command; exit 3"]))
        })
        .expect("spawn");
        let log = job.log.clone();
        let error = job.join().expect_err("the command exits 3");
        assert_eq!(error.to_string(), "setup failed at step `xtask-test-failing-step`");
        let text = fs::read_to_string(&log).expect("the log");
        assert_eq!(text, "$ sh -c 'echo printed-by-the-command; exit 3'\nprinted-by-the-command\n");
        assert_eq!(tail(&log), text.trim_end());
        let _ = fs::remove_file(log);
    }
}
