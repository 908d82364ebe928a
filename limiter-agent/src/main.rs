use clap::Parser as _;

fn main() -> std::process::ExitCode {
    match limiter::cli::dispatch(limiter::cli::Cli::parse()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("limiter: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
