//! `cargo run`: the whole gateway on one laptop.

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--openapi") {
        // The OpenAPI document on stdout: `cargo run -- --openapi > docs/openapi.json`.
        return match dhukuti::openapi_json() {
            Ok(doc) => {
                print!("{doc}");
                ExitCode::SUCCESS
            }
            Err(msg) => {
                eprintln!("dhukuti: {msg}");
                ExitCode::FAILURE
            }
        };
    }
    if args.iter().any(|a| a == "--init-only") {
        // Create what the functions need on an AWS(-compatible) server and
        // stop: SAM local runs the functions (infra/README.md).
        if args.len() > 1 {
            eprintln!(
                "dhukuti: --init-only takes no other argument\n\n{}",
                dhukuti::USAGE
            );
            return ExitCode::from(2);
        }
        let backend = match shared::app::Backend::from_env() {
            Ok(b) => b,
            Err(msg) => {
                eprintln!("dhukuti: {msg}");
                return ExitCode::from(2);
            }
        };
        return match dhukuti::sam_local::init_only(&backend).await {
            Ok(lines) => {
                println!("{}", backend.describe());
                for line in lines {
                    println!("  {line}");
                }
                ExitCode::SUCCESS
            }
            Err(msg) => {
                eprintln!("dhukuti: {msg}");
                ExitCode::FAILURE
            }
        };
    }
    let settings = match dhukuti::Settings::from_env_and_args(&args) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let running = match dhukuti::start(settings.clone()).await {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("dhukuti: {msg}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", dhukuti::banner(&running, &settings));
    match running.until_signal().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dhukuti: server error: {e}");
            ExitCode::FAILURE
        }
    }
}
