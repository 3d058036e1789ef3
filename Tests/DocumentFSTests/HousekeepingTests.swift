import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// File managers' housekeeping files: `.DS_Store`, `._*`, `Thumbs.db` and
/// `desktop.ini` work in the mount like any file but never reach the store, unless the mount
/// keeps them (`-o housekeeping=keep`).
@Suite(.serialized)
struct HousekeepingTests {
    static let names = [".DS_Store", "._notes.txt", "Thumbs.db", "desktop.ini"]

    func writeEverywhere(_ mount: TestMount) async throws {
        try await offThread {
            for name in Self.names {
                for directory in [mount.path, mount.url("Work.pkg"), mount.url("Work.pkg/sub")] {
                    try writeText(directory + "/" + name, "cache of \(name)\n")
                    #expect(
                        try String(contentsOfFile: directory + "/" + name, encoding: .utf8)
                            == "cache of \(name)\n")
                }
            }
            // The package's own file is saved meanwhile, so a save of the package did happen.
            try writeText(mount.url("Work.pkg/new.txt"), "new\n")
        }
    }

    @Test(
        "by default they work in the mount (root, package, subfolder) and are never stored",
        arguments: StoreKind.all)
    func scratchByDefault(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            try await writeEverywhere(mount)
            _ = try await waitUntil(timeout: 3) { try engine.paths("Work.pkg").contains("new.txt") }
            // Listed in the mount.
            let listed = try await offThread { try entries(in: mount.url("Work.pkg")) }
            for name in Self.names { #expect(listed.contains(name), "\(name) in \(listed)") }
        }
        let documents = try engine.documentNames()
        let paths = try engine.paths("Work.pkg")
        #expect(paths.contains("new.txt"))
        for name in Self.names {
            #expect(!documents.contains(name), "\(name) became a document")
            #expect(
                !paths.contains(name) && !paths.contains("sub/" + name), "\(name) became a wrapper: \(paths)")
        }
    }

    @Test("-o housekeeping=keep stores them like any file", arguments: [StoreKind.sqlite])
    func kept(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store, configure: { $0.fileSystem.scratchNames = .editorsOnly }) {
            mount in
            try await writeEverywhere(mount)
        }
        let documents = try engine.documentNames()
        let paths = try engine.paths("Work.pkg")
        for name in Self.names {
            #expect(documents.contains(name), "\(name) is not a document: \(documents)")
            #expect(
                paths.contains(name) && paths.contains("sub/" + name), "\(name) is not a wrapper: \(paths)")
        }
    }
}
