/// The proxy allocates per request (headers, bodies, futures) on several threads;
/// mimalloc's thread-local free lists serve that pattern better than glibc's arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    limiter::main()
}
