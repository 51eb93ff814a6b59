fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let paths: Vec<String> = args.into_iter().filter(|a| a != "--json").collect();
    std::process::exit(sim::run(&paths, sim::Output { json, trace: false }));
}
