//! A host stand-in for `aya_ebpf::programs::XdpContext` and the one helper the packet
//! parser calls. In the kernel the verifier proves that every read stays below
//! `data_end`; here the frame's last byte is the last byte before a page that cannot
//! be read, so a read past `data_end` faults and the fuzzer reports it.

use std::{ptr::NonNull, sync::Mutex};

/// The largest linear part a frame can have here (the fuzzer's `-max_len` is below it).
pub const MAX_FRAME: usize = 16 * 1024;

pub mod programs {
    /// The parser reads `data()`, `data_end()` and passes `ctx` to the helper.
    #[derive(Debug)]
    pub struct XdpContext {
        pub ctx: *mut crate::XdpMd,
        data: usize,
        data_end: usize,
    }

    impl XdpContext {
        pub fn data(&self) -> usize {
            self.data
        }

        pub fn data_end(&self) -> usize {
            self.data_end
        }
    }

    pub(crate) fn context(md: *mut crate::XdpMd, data: usize, data_end: usize) -> XdpContext {
        XdpContext { ctx: md, data, data_end }
    }
}

pub mod helpers {
    /// `bpf_xdp_get_buff_len`: the linear part plus the fragments.
    ///
    /// # Safety
    /// `md` comes from an `XdpContext` made by [`crate::with_frame`], alive for the call.
    pub unsafe fn bpf_xdp_get_buff_len(md: *mut crate::XdpMd) -> u64 {
        // SAFETY: the caller passes the context's own pointer, valid during `with_frame`.
        unsafe { (*md).buff_len }
    }
}

/// What the kernel's `xdp_md` tells the helper: here only the whole length.
#[derive(Debug)]
pub struct XdpMd {
    buff_len: u64,
}

/// Pages of frame space followed by one page mapped without access.
struct GuardedBuffer {
    end_of_frames: NonNull<u8>,
}

// SAFETY: the mapping is only touched under the `BUFFER` lock.
unsafe impl Send for GuardedBuffer {}

static BUFFER: Mutex<Option<GuardedBuffer>> = Mutex::new(None);

impl GuardedBuffer {
    fn map() -> Self {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page size");
        let frames = MAX_FRAME.div_ceil(page) * page;
        // SAFETY: a fresh anonymous private mapping, checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                frames + page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap failed");
        // SAFETY: the last page lies inside the mapping just made.
        let guard = unsafe { base.cast::<u8>().add(frames) };
        // SAFETY: `guard` is page-aligned and inside the mapping.
        assert_eq!(unsafe { libc::mprotect(guard.cast(), page, libc::PROT_NONE) }, 0, "mprotect failed");
        Self { end_of_frames: NonNull::new(guard).expect("mmap returned null") }
    }
}

/// Runs `parse` on a context whose linear part is `linear` (ending just before the
/// guard page) and whose whole buffer is `fragments` bytes longer, as a multi-buffer
/// frame under `xdp.frags` would be.
///
/// # Panics
/// When `linear` is longer than [`MAX_FRAME`].
pub fn with_frame<T>(linear: &[u8], fragments: u64, parse: impl FnOnce(&programs::XdpContext) -> T) -> T {
    assert!(linear.len() <= MAX_FRAME, "a frame of {} bytes is over {MAX_FRAME}", linear.len());
    let mut buffer = BUFFER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let end = buffer.get_or_insert_with(GuardedBuffer::map).end_of_frames;
    // SAFETY: `linear.len() <= MAX_FRAME`, so the start is inside the writable pages.
    let start = unsafe { end.as_ptr().sub(linear.len()) };
    // SAFETY: `start..end` is writable, and `linear` cannot overlap a private mapping.
    unsafe { std::ptr::copy_nonoverlapping(linear.as_ptr(), start, linear.len()) };
    let mut md = XdpMd { buff_len: linear.len() as u64 + fragments };
    let ctx = programs::context(&raw mut md, start as usize, end.as_ptr() as usize);
    parse(&ctx)
}
