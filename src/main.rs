fn main() {
    std::process::exit(sbxfs::cli::main());
}
