import DocumentEngine
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 8, points 4 and 6 through the command: a store damaged on disk, and a store crafted to
/// make `docfs export` write outside its destination.
extension DocfsMountTests {
    /// A copy of the demo store damaged one way.
    func damagedCopy(_ name: String, _ damage: (String) throws -> Void) throws -> String {
        let path = sandbox.path(name)
        try FileManager.default.copyItem(atPath: store, toPath: path)
        try damage(path)
        return path
    }

    @Test("a store cut in half, with garbage over its pages, or of a newer format: mount, fsck and ls say so in one line")
    func damagedStores() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let size = try #require(try FileManager.default.attributesOfItem(atPath: store)[.size] as? Int)
            try #require(size >= 8 * 4096, "the demo store has \(size) bytes")
            let truncated = try damagedCopy("Truncated.docstore") { path in
                #expect(truncate(path, off_t(size / 2)) == 0)
            }
            let garbage = try damagedCopy("Garbage.docstore") { path in
                // Every page but the first (the header and schema) overwritten with noise.
                let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
                var generator = SystemRandomNumberGenerator()
                try handle.seek(toOffset: 4096)
                try handle.write(contentsOf: Data((4096..<size).map { _ in UInt8.random(in: 0...255, using: &generator) }))
                try handle.close()
            }
            let newer = try damagedCopy("Newer.docstore") { path in
                try sqlite(path, "UPDATE store_meta SET value = 99 WHERE key = 'format';")
            }
            for (path, message) in [
                (truncated, "is damaged"), (garbage, "is damaged"), (newer, "has format 99, newer than this program's"),
            ] {
                expectFailure(try docfs(["mount", path, mountpoint]), message)
                #expect(Mounts.entry(at: mountpoint) == nil)
                expectFailure(try docfs(["ls", path]), message)
                let fsck = try docfs(["fsck", path])
                #expect(fsck.status == 2, "\(fsck)")
                #expect(fsck.errorLines.count == 1 && fsck.stderr.hasPrefix("docfs: ") && fsck.stderr.contains(message), "\(fsck)")
            }
        }
    }

    @Test("export never writes outside its destination: a crafted document name with .. or /, a symbolic link as the destination")
    func exportStaysInside() async throws {
        try await onOwnThread { [self] in
            let out = try folder("out")
            // Only a hostile or damaged store has such names: the API refuses them.
            try sqlite(store, "UPDATE documents SET name = '../Escaped.txt' WHERE name = 'README.txt';")
            try sqlite(store, "UPDATE documents SET name = 'a/../../Slashed.txt' WHERE name = 'Shopping List.txt';")
            for name in ["../Escaped.txt", "a/../../Slashed.txt"] {
                let result = try docfs(["export", store, name, out])
                #expect(result.status != 0, "\(name): \(result)")
                #expect(result.errorLines.count == 1 && result.stderr.hasPrefix("docfs: "), "\(result)")
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: out).isEmpty)
            #expect(!FileManager.default.fileExists(atPath: sandbox.path("Escaped.txt")))
            #expect(!FileManager.default.fileExists(atPath: sandbox.path("Slashed.txt")))
            #expect(!FileManager.default.fileExists(atPath: sandbox.path("../Escaped.txt")))

            // A destination that is a symbolic link to a folder elsewhere: not followed, even with --force.
            let elsewhere = try folder("elsewhere")
            #expect(symlink(elsewhere, sandbox.path("link")) == 0)
            let linked = try docfs(["export", store, "Things I Own.mystuff", sandbox.path("link")])
            #expect(linked.status != 0, "\(linked)")
            // Inside a symbolic link to a folder.
            let inside = try docfs(["export", store, "Things I Own.mystuff", sandbox.path("link/Things.mystuff")])
            #expect(inside.status != 0, "\(inside)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere).isEmpty)
            // --force replaces the link itself, not what it points to.
            let forced = try docfs(["export", store, "Things I Own.mystuff", sandbox.path("link"), "--force"])
            #expect(try FileManager.default.contentsOfDirectory(atPath: elsewhere).isEmpty, "\(forced)")
        }
    }

    @Test("under umask 000 a new store is 0600 (and its log), its folders 0700")
    func privateUnderAnyUmask() async throws {
        try await onOwnThread { [self] in
            let umask0 = ["/bin/sh", "-c", "umask 000; exec \"$@\"", "sh"]
            let created = try docfs(["create", "--demo"], prefix: umask0)
            #expect(created.status == 0, "\(created)")
            #expect(DocfsTests.permissions(sandbox.defaultStore) == 0o600)
            #expect(DocfsTests.permissions(sandbox.path("home/.local/share/docfs/Documents")) == 0o700)
            #expect(DocfsTests.permissions(sandbox.path("home/.local/share/docfs")) == 0o700)
            let other = sandbox.path("deep/er/Other.docstore")
            let made = try docfs(["create", other], prefix: umask0)
            #expect(made.status == 0, "\(made)")
            #expect(DocfsTests.permissions(other) == 0o600)
            #expect(DocfsTests.permissions(sandbox.path("deep/er")) == 0o700)
            // The log and shared-memory files exist while a process has the store open (a mount).
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let mounted = try docfs(["mount", other, mountpoint], prefix: umask0)
            #expect(mounted.status == 0, "\(mounted)")
            for file in [other + "-wal", other + "-shm"] where FileManager.default.fileExists(atPath: file) {
                #expect(DocfsTests.permissions(file) == 0o600, "\(file)")
            }
            let unmounted = try docfs(["unmount", mountpoint])
            #expect(unmounted.status == 0, "\(unmounted)")
        }
    }
}
