// swift-tools-version: 6.1
import PackageDescription

// The benchmark's helper program, kept out of the main package so that CI's
// `swift build --build-tests` never builds it. scripts/bench.sh builds it in release mode with
// its own scratch path (.build-bench).
//
// No benchmark framework: ordo-one/benchmark and google/swift-benchmark time closures inside
// one process, but most figures here are syscalls against a FUSE mount served by another
// process (the real `docfs mount` daemon) and compared with a native folder in the same run.
// A plain monotonic clock around each operation, repeated in rounds and summarised as median
// and min–max by `docfs-bench report`, is all that needs.
let package = Package(
    name: "DocFSBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        // The root package, by path: the engine figures (B6) call DocumentEngine directly, on an
        // SQLite file (SQLiteStore) or a PostgreSQL database (PostgresStore, BENCH_STORE=postgres).
        .package(name: "DocFS", path: "..")
    ],
    targets: [
        .executableTarget(
            name: "docfs-bench",
            dependencies: [
                .product(name: "DocumentEngine", package: "DocFS"),
                .product(name: "PostgresStore", package: "DocFS"),
                .product(name: "SQLiteStore", package: "DocFS"),
            ]
        )
    ],
    swiftLanguageModes: [.v6]
)
