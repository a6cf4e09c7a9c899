//! The `jail` binary: the command line lives in the library (jail/src/cli.rs).

fn main() -> std::process::ExitCode {
    jail::cli::main()
}
