// swift-tools-version: 6.1
// libFuzzer targets for DocFS's decoders of untrusted bytes (issue 8, point 5). A package of its own
// so that the main package's build and CI never compile them; scripts/fuzz.sh builds and runs them
// with `-sanitize=fuzzer` in the scratch directory .build-fuzz.
import Foundation
import PackageDescription

// A path dependency's identity is its directory's name, which differs between checkouts.
let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
let rootIdentity = root.lastPathComponent.lowercased()

let engine: Target.Dependency = .product(name: "DocumentEngine", package: rootIdentity)
let stores: [Target.Dependency] = [
    .product(name: "VersionedStore", package: rootIdentity),
    .product(name: "SQLiteStore", package: rootIdentity),
]

// The entry point finds libFuzzer's driver with dlsym.
let linker: [LinkerSetting] = [.unsafeFlags(["-Xlinker", "--export-dynamic-symbol=LLVMFuzzerRunDriver"])]

let package = Package(
    name: "DocFSFuzz",
    dependencies: [.package(path: root.path)],
    targets: [
        .executableTarget(name: "fuzz-wrapper", dependencies: [engine], linkerSettings: linker),
        .executableTarget(name: "fuzz-archive", dependencies: [engine], linkerSettings: linker),
        .executableTarget(name: "fuzz-plist", dependencies: [engine], linkerSettings: linker),
        .executableTarget(name: "fuzz-store", dependencies: [engine] + stores, linkerSettings: linker),
    ],
    swiftLanguageModes: [.v6]
)
