//! Memory per tracked key in the proxy (heap bytes counted by a wrapping global
//! allocator while the `MemoryStore` fills with N keys) and per tracked source in the
//! kernel (the sources map's `bytes_memlock` from bpftool over its capacity; the LRU
//! hash is preallocated, so that is what every slot costs). Prints one JSON object.
//!
//! Usage: bench_memory [PROXY_KEYS] [KERNEL_SOURCES]   (the kernel part needs root)

use std::{
    alloc::{GlobalAlloc, Layout, System},
    num::{NonZeroU32, NonZeroUsize},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicIsize, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use limiter::xdp::{Kernel, LoadOptions};
use limiter_core::{
    Algorithm, LimitSpec,
    limits::{Bucket, Charge, MemoryStore},
};
use limiter_lab::report::{KernelMemory, Memory, ProxyMemory};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: per the caller.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: per the caller.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: per the caller.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn proxy_bytes_per_key(algorithm: Algorithm, keys: usize) -> f64 {
    let spec = LimitSpec {
        algorithm,
        limit: NonZeroU32::new(100).unwrap_or(NonZeroU32::MIN),
        window: Duration::from_secs(60),
        burst: None,
        throttle: None,
        queue: None,
        cost: limiter_core::Cost::default(),
        calendar: None,
    };
    let names: Vec<String> =
        (0..keys).map(|i| format!("10.{}.{}.{}", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff)).collect();
    let policy: Arc<str> = Arc::from("per-ip");
    let before = LIVE.load(Ordering::Relaxed);
    // Room to spare: the bound is split over shards, and no key may be evicted here.
    let store = MemoryStore::new(NonZeroUsize::new(keys * 2 + 64 * 64).unwrap_or(NonZeroUsize::MIN));
    let now = Duration::from_secs(1_700_000_000);
    for name in &names {
        store.apply(&[Bucket { policy: &policy, key: name, spec: &spec }], now, Charge::AllOrNothing);
    }
    assert_eq!(store.tracked_keys(), keys);
    let used = LIVE.load(Ordering::Relaxed) - before;
    drop(store);
    used as f64 / keys as f64
}

fn kernel_bytes_per_source(capacity: u32) -> anyhow::Result<KernelMemory> {
    let pin_dir = PathBuf::from(format!("/sys/fs/bpf/limiter-bench-mem-{}", std::process::id()));
    let kernel = Kernel::load(&LoadOptions::with_sources(pin_dir.clone(), capacity))?;
    let output = std::process::Command::new("bpftool")
        .args(["-j", "map", "show", "pinned"])
        .arg(pin_dir.join("SOURCES"))
        .output()?;
    drop(kernel);
    limiter::xdp::detach_all(&pin_dir)?;
    let _ = std::fs::remove_dir_all(&pin_dir);
    let info: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let field = |name: &str| info[name].as_u64().with_context(|| format!("bpftool gave no {name}: {info}"));
    let memlock = field("bytes_memlock")? as f64;
    Ok(KernelMemory {
        capacity,
        map_type: info["type"].as_str().unwrap_or_default().to_owned(),
        key_bytes: field("bytes_key")?,
        value_bytes: field("bytes_value")?,
        bytes_memlock: memlock,
        bytes_per_source: memlock / f64::from(capacity),
    })
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let keys: usize = args.next().map_or(Ok(100_000), |a| a.parse())?;
    let sources: u32 = args.next().map_or(Ok(1_000_000), |a| a.parse())?;
    let proxy: Vec<_> =
        [Algorithm::TokenBucket, Algorithm::FixedWindow, Algorithm::SlidingWindowLog, Algorithm::SlidingWindowCounter]
            .into_iter()
            .map(|a| ProxyMemory { algorithm: format!("{a:?}"), keys, bytes_per_key: proxy_bytes_per_key(a, keys) })
            .collect();
    let kernel = kernel_bytes_per_source(sources)?;
    println!("{}", serde_json::to_string(&Memory { proxy, kernel })?);
    Ok(())
}
