//! `jail-serve`: the binary; the service is the library (lib.rs).

fn main() -> std::process::ExitCode {
    jail_serve::main()
}
