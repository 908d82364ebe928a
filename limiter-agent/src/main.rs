use clap::Parser as _;

/// The proxy allocates per request (headers, bodies, futures) on several threads;
/// mimalloc's thread-local free lists serve that pattern better than glibc's arenas.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    match limiter::cli::dispatch(limiter::cli::Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            // anyhow's alternate form prints the whole chain of causes on one line.
            eprintln!("limiter: {:#}", anyhow::Error::from(error));
            std::process::ExitCode::FAILURE
        }
    }
}
