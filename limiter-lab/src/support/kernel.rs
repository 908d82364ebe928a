//! The XDP program loaded under a private pin directory, for `BPF_PROG_TEST_RUN`.

use std::{
    path::PathBuf,
    sync::Barrier,
    time::{Duration, Instant},
};

use aya::programs::{TestRun as _, TestRunOptions};
use limiter::{
    config::{Config, xdp::XdpConfig},
    xdp::{Kernel, LoadOptions},
};
use limiter_common::counters::Counter;

use super::unique;

/// The XDP config in `toml` (an `[xdp]` table, without the header).
pub fn xdp_config(toml: &str) -> XdpConfig {
    let text = format!("[xdp]\ninterfaces = []\n{toml}");
    Config::parse(&text, "test.toml".as_ref()).expect("test config").xdp.expect("xdp section")
}

/// The program loaded with private pins, for `BPF_PROG_TEST_RUN`.
#[derive(Debug)]
pub struct TestKernel {
    pub kernel: Kernel,
    pub pin_dir: PathBuf,
}

impl TestKernel {
    pub fn new(config: &XdpConfig) -> Self {
        let pin_dir = PathBuf::from("/sys/fs/bpf").join(unique("limiter-test-"));
        let options = LoadOptions::for_config(pin_dir.clone(), config);
        let mut kernel = Kernel::load(&options).expect("load XDP program (run as root)");
        kernel.maps_mut().apply(config, None).expect("apply config");
        Self { kernel, pin_dir }
    }

    /// Runs the program once on `frame`; the XDP verdict.
    pub fn run(&self, frame: &[u8]) -> u32 {
        self.try_run(frame).expect("test run")
    }

    pub fn try_run(&self, frame: &[u8]) -> Result<u32, aya::programs::ProgramError> {
        let options = TestRunOptions { data_in: Some(frame), ..TestRunOptions::default() };
        Ok(self.kernel.program().expect("program").test_run(options)?.return_value)
    }

    /// Runs the program `repeat` times on `frame` in the kernel from two threads at
    /// once (two CPUs on this machine), started together; how long both took.
    pub fn run_on_two_cpus(&self, frame: &[u8], repeat: u32) -> Duration {
        let start_together = Barrier::new(2);
        let started = Instant::now();
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    start_together.wait();
                    let options = TestRunOptions { data_in: Some(frame), repeat, ..TestRunOptions::default() };
                    self.kernel.program().expect("program").test_run(options).expect("test run");
                });
            }
        });
        started.elapsed()
    }

    pub fn counter(&self, counter: Counter) -> u64 {
        self.kernel.maps().counter_snapshot().expect("counters").get(counter)
    }

    /// All counters as `(name, value)`, for asserting exactly which moved.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let snapshot = self.kernel.maps().counter_snapshot().expect("counters");
        Counter::ALL.iter().map(|c| (c.name(), snapshot.get(*c))).filter(|(_, n)| *n != 0).collect()
    }
}

impl Drop for TestKernel {
    fn drop(&mut self) {
        let _ = limiter::xdp::detach_all(&self.pin_dir);
    }
}
