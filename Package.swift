// swift-tools-version: 6.1
import PackageDescription

// One module per layer (see docs/design/architecture.md): the FUSE binding knows nothing of documents,
// the engine knows nothing of FUSE, DocumentFS joins them, and the executable is thin.
let package = Package(
    name: "DocFS",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "DocumentEngine", targets: ["DocumentEngine"]),
        .library(name: "FUSE", targets: ["FUSE"]),
        .library(name: "DocumentFS", targets: ["DocumentFS"]),
        .library(name: "VersionedStore", targets: ["VersionedStore"]),
        .library(name: "SQLiteStore", targets: ["SQLiteStore"]),
        .library(name: "PostgresStore", targets: ["PostgresStore"]),
        .executable(name: "docfs", targets: ["docfs"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-system", from: "1.8.1"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        // `swift package generate-documentation` (scripts/docs.sh): DocumentEngine's DocC catalog.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // libfuse 3.14's low-level API, imported through a shim header (FUSE_USE_VERSION 312).
        .systemLibrary(
            name: "CFuse3",
            pkgConfig: "fuse3",
            providers: [.apt(["libfuse3-dev"])]
        ),
        // Threads and the locks they share: the ranked locks with the lock order checked in debug
        // builds, the monitor (the one way to wait), and thread starting.
        .target(name: "Threading", dependencies: ["CLinuxSupport"]),
        .target(
            name: "FUSE",
            dependencies: [
                "CFuse3",
                "Threading",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Linux calls Swift's Glibc module does not export (xattrs, renameat2).
        .target(name: "CLinuxSupport"),
        // SHA-256 from the system's libcrypto (OpenSSL).
        .systemLibrary(name: "CLibCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // PostgreSQL's own client library.
        .systemLibrary(name: "CLibPQ", pkgConfig: "libpq", providers: [.apt(["libpq-dev"])]),
        .target(
            name: "DocumentEngine",
            dependencies: [
                "CLinuxSupport",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
                "CLibCrypto",
            ]
        ),
        // The versioned-store algorithm, once, over a small backend protocol; and the in-memory
        // backend. Knows no database.
        .target(
            name: "VersionedStore",
            // CRC-32C for the intent log's records.
            dependencies: ["DocumentEngine", "CLinuxSupport", "Threading"]
        ),
        // The SQL both database backends run as written, over the tables they share.
        .target(name: "StoreSQL", dependencies: ["VersionedStore"]),
        // The embedded store on SQLite. The only module that imports GRDB.
        .target(
            name: "SQLiteStore",
            dependencies: [
                "DocumentEngine",
                "VersionedStore",
                "StoreSQL",
                .product(name: "GRDB", package: "GRDB.swift"),
                // sqlite3_system_errno, to tell a full disk among SQLite's I/O errors.
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                // sync_file_range, for packs.
                "CLinuxSupport",
                // The watcher of lock releases by other processes.
                "Threading",
            ]
        ),
        // The shared store on PostgreSQL, through libpq. The only module that imports it.
        .target(
            name: "PostgresStore",
            dependencies: [
                "DocumentEngine",
                "VersionedStore",
                "StoreSQL",
                "CLibPQ",
                "Threading",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "DocumentFS",
            dependencies: [
                "DocumentEngine",
                // The versioned store's refinement for file systems (FileSystemStore), no database.
                "VersionedStore",
                "CLinuxSupport",
                "FUSE",
                "Threading",
                .product(name: "SystemPackage", package: "swift-system"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "docfs",
            dependencies: [
                "DocumentFS",
                "FUSE",
                "DocumentEngine",
                "SQLiteStore",
                "PostgresStore",
                "CLinuxSupport",
                "SampleDocuments",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // A child process the store's kill test saves with and kills mid-save.
        .executableTarget(
            name: "store-torture", dependencies: ["DocumentEngine", "SQLiteStore", "PostgresStore"]),
        // A passthrough file system that drops every unsynced write at a power cut
        // (scripts/power-loss.sh); a test tool, not a product.
        .executableTarget(
            name: "lossyfs",
            dependencies: [
                "FUSE", "CFuse3", "CLinuxSupport", .product(name: "SystemPackage", package: "swift-system"),
            ],
            path: "Tests/LossyFS"),
        // The seeds' document types (MyStuff, ImageNotes, text), used by the demo store and tests.
        .target(name: "SampleDocuments", dependencies: ["DocumentEngine"]),
        // Helpers shared by the test targets; not a product.
        .target(name: "TestSupport", path: "Tests/TestSupport"),
        // Store fixtures of every kind (SQLite, PostgreSQL) for the parameterised suites.
        .target(
            name: "StoreTestSupport",
            dependencies: ["DocumentEngine", "VersionedStore", "SQLiteStore", "PostgresStore"],
            path: "Tests/StoreTestSupport"),
        .testTarget(
            name: "DocumentEngineTests",
            dependencies: [
                "DocumentEngine",
                "TestSupport",
                "StoreTestSupport",
                "VersionedStore",
                "StoreSQL",
                "SQLiteStore",
                "PostgresStore",
                "CLinuxSupport",
                .product(name: "SystemPackage", package: "swift-system"),
                // The store tests look at SQLite connection settings.
                .product(name: "GRDB", package: "GRDB.swift"),
            ]
        ),
        .testTarget(
            name: "SampleDocumentsTests", dependencies: ["SampleDocuments", "DocumentEngine", "SQLiteStore"]),
        .testTarget(
            name: "VersionedStoreTests", dependencies: ["VersionedStore", "DocumentEngine", "TestSupport"]),
        .testTarget(
            name: "DocumentFSTests",
            dependencies: [
                "TestSupport", "StoreTestSupport", "VersionedStore", "SQLiteStore", "PostgresStore",
                "DocumentFS", "DocumentEngine", "FUSE", "SampleDocuments", "CLinuxSupport",
                .product(name: "SystemPackage", package: "swift-system"),
            ]),
        .testTarget(
            name: "DocfsTests",
            dependencies: [
                "docfs", "TestSupport", "StoreTestSupport", "SQLiteStore", "PostgresStore", "DocumentEngine",
                "VersionedStore",
                "SampleDocuments",
            ]),
        // Micro-benchmark of the FUSE layer (scripts/fuse-bench.sh).
        .executableTarget(
            name: "FUSEBench",
            dependencies: [
                "FUSE",
                "Threading",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // Mounts lossyfs for real: what a power cut keeps and drops.
        .testTarget(name: "LossyFSTests", dependencies: ["lossyfs", "TestSupport"]),
        .testTarget(name: "ThreadingTests", dependencies: ["Threading"]),
        .testTarget(
            name: "FUSETests",
            dependencies: [
                "FUSE",
                "TestSupport",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
