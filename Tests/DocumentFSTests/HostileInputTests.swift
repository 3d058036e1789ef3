import CLinuxSupport
import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Issue 8, points 4 and 6 through the mount: hostile names, huge and many extended attributes,
/// a store damaged under a running mount, and who may use a mount.
@Suite(.serialized)
struct HostileInputTests {
    /// `errno` of a call through `directory/name`, `name` as raw bytes (0 when it succeeded).
    static func errnoOf(_ directory: String, _ name: [UInt8], _ call: (UnsafePointer<CChar>) -> Int32)
        -> Int32
    {
        let bytes = Array(directory.utf8) + [0x2F] + name + [0]
        let rc = bytes.withUnsafeBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { call($0.baseAddress!) }
        }
        return rc < 0 ? errno : 0
    }

    static func create(_ directory: String, _ name: [UInt8]) -> Int32 {
        errnoOf(directory, name) { path in
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o644)
            if fd >= 0 { close(fd) }
            return fd
        }
    }

    static func mkdirAt(_ directory: String, _ name: [UInt8]) -> Int32 {
        errnoOf(directory, name) { mkdir($0, 0o755) }
    }

    static func renameTo(_ from: String, _ directory: String, _ name: [UInt8]) -> Int32 {
        errnoOf(directory, name) { rename(from, $0) }
    }

    @Test(
        "names: over 255 bytes ENAMETOOLONG, not UTF-8 EILSEQ, control characters kept, in a package and at the root"
    )
    func hostileNames() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let long = [UInt8](repeating: 0x61, count: 256)
        let longest = [UInt8](repeating: 0x62, count: 255)
        let notUTF8: [UInt8] = [0x62, 0xFF, 0xFE, 0x2E, 0x74, 0x78, 0x74]
        let control = "tab\there\u{1}bell\u{7}\n.txt"
        try await withMount(fixture.store) { mount in
            let results = try await offThread { () -> [String: Int32] in
                var r: [String: Int32] = [:]
                for (place, directory) in [("package", mount.url("Work.pkg")), ("root", mount.path)] {
                    r["\(place) create long"] = Self.create(directory, long)
                    r["\(place) mkdir long"] = Self.mkdirAt(directory, long)
                    r["\(place) create not UTF-8"] = Self.create(directory, notUTF8)
                    r["\(place) mkdir not UTF-8"] = Self.mkdirAt(directory, notUTF8)
                    r["\(place) create 255"] = Self.create(directory, longest)
                    r["\(place) create control"] = Self.create(directory, Array(control.utf8))
                }
                r["rename long"] = Self.renameTo(mount.url("Work.pkg/notes.txt"), mount.url("Work.pkg"), long)
                r["rename not UTF-8"] = Self.renameTo(
                    mount.url("Work.pkg/notes.txt"), mount.url("Work.pkg"), notUTF8)
                r["root rename long"] = Self.renameTo(mount.url("Flat.txt"), mount.path, long)
                r["symlink long"] = Self.errnoOf(mount.url("Work.pkg"), long) { symlink("notes.txt", $0) }
                return r
            }
            for place in ["package", "root"] {
                #expect(results["\(place) create long"] == ENAMETOOLONG)
                #expect(results["\(place) mkdir long"] == ENAMETOOLONG)
                #expect(results["\(place) create not UTF-8"] == EILSEQ)
                #expect(results["\(place) mkdir not UTF-8"] == EILSEQ)
                #expect(results["\(place) create 255"] == 0)
                #expect(results["\(place) create control"] == 0)
            }
            #expect(results["rename long"] == ENAMETOOLONG)
            #expect(results["rename not UTF-8"] == EILSEQ)
            #expect(results["root rename long"] == ENAMETOOLONG)
            #expect(results["symlink long"] == ENAMETOOLONG)
            // Control characters are ordinary name bytes (as on ext4): listed and saved as given.
            let listed = try await offThread {
                try FileManager.default.contentsOfDirectory(atPath: mount.url("Work.pkg"))
            }
            #expect(listed.contains(control))
            #expect(listed.contains(String(decoding: longest, as: UTF8.self)))
            try await expectEventually("the names in the store") {
                let tree = try engine.tree("Work.pkg")
                let names = try engine.documentNames()
                return tree[control] != nil && tree[String(decoding: longest, as: UTF8.self)] != nil
                    && names.contains(control) && names.contains(String(decoding: longest, as: UTF8.self))
            }
            // Nothing else was made, and the renames left their files where they were.
            #expect(
                Set(try engine.tree("Work.pkg").keys.filter { !$0.contains("/") && !$0.isEmpty })
                    == ["notes.txt", "sub", "link", control, String(decoding: longest, as: UTF8.self)])
            #expect(try engine.text("Work.pkg", "notes.txt") == Fixture.notesText)
        }
    }

    @Test("xattrs: a 64 KiB value is kept, a larger one E2BIG; 300 attributes; other namespaces ENOTSUP")
    func hugeAndManyXattrs() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let file = mount.url("Work.pkg/notes.txt")
            let results = try await offThread { () -> [String: Int32] in
                var r: [String: Int32] = [:]
                func set(_ name: String, _ value: [UInt8]) -> Int32 {
                    setxattr(file, name, value, value.count, 0) < 0 ? errno : 0
                }
                r["64 KiB"] = set("user.big", [UInt8](repeating: 7, count: 65536))
                r["64 KiB + 1"] = set("user.bigger", [UInt8](repeating: 7, count: 65537))
                r["1 MiB"] = set("user.huge", [UInt8](repeating: 7, count: 1 << 20))
                r["long name"] = set("user." + String(repeating: "n", count: 251), [1])
                for namespace in ["trusted.x", "security.x", "system.x", "user.", "other.x"] {
                    r[namespace] = set(namespace, [1])
                }
                for i in 0..<300 {
                    let failed = set("user.attribute-\(i)", Array("value \(i)".utf8))
                    if failed != 0 { r["many \(i)"] = failed }
                }
                var buffer = [UInt8](repeating: 0, count: 70000)
                let size = getxattr(file, "user.big", &buffer, buffer.count)
                r["read 64 KiB"] = size == 65536 && buffer[..<65536].allSatisfy { $0 == 7 } ? 0 : -1
                var list = [CChar](repeating: 0, count: 65536)
                let listed = listxattr(file, &list, list.count)
                r["listed"] = Int32(listed < 0 ? -1 : list[..<listed].filter { $0 == 0 }.count)
                return r
            }
            #expect(results["64 KiB"] == 0)
            #expect(results["read 64 KiB"] == 0)
            #expect(results["64 KiB + 1"] == E2BIG)
            #expect(results["1 MiB"] == E2BIG)
            #expect(results["long name"] == ERANGE)
            for namespace in ["trusted.x", "security.x", "system.x", "user.", "other.x"] {
                #expect(
                    results[namespace] == ENOTSUP || results[namespace] == EPERM,
                    "\(namespace): \(results[namespace] ?? 0)")
            }
            #expect(!results.keys.contains { $0.hasPrefix("many") }, "\(results)")
            // user.color from the fixture, user.big and the 300.
            #expect(results["listed"] == 302)
            try await expectEventually("the attributes in the store") {
                let attributes = try engine.record("Work.pkg", "notes.txt")?.extendedAttributes ?? [:]
                return attributes.count == 302 && attributes["user.big"]?.count == 65536
                    && attributes["user.attribute-299"] == Data("value 299".utf8)
            }
        }
    }

    @Test(
        "a store damaged under a running mount: EIO for the damaged document and file, the others still served",
        arguments: StoreKind.all)
    func damageWhileMounted(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            // The root is listed; the documents' wrappers are not read yet. Another process then
            // damages one row of Other.pkg (SQLite: a text where an integer belongs; PostgreSQL,
            // whose columns are typed: a wrapper kind that does not exist) and removes the chunk
            // of Work.pkg/sub/inner.txt.
            _ = try await offThread { try FileManager.default.contentsOfDirectory(atPath: mount.path) }
            let badRow =
                kind == .sqlite
                ? "UPDATE nodes SET uid = 'garbage' WHERE name = 'other.txt';"
                : "UPDATE nodes SET kind = 99 WHERE name = 'other.txt';"
            _ = try await offThread {
                try fixture.stores.sql(
                    badRow
                        + " DELETE FROM chunks WHERE id IN (SELECT chunk FROM extents WHERE node ="
                        + " (SELECT node FROM nodes WHERE name = 'inner.txt'));")
            }
            let other = try await sh("ls Other.pkg", in: mount.path)
            #expect(other.status != 0 && other.error.contains("Input/output error"), "\(other)")
            let inner = try await sh("cat Work.pkg/sub/inner.txt", in: mount.path)
            #expect(inner.status != 0 && inner.error.contains("Input/output error"), "\(inner)")
            // Everything else is served, and saved.
            let rest = try await sh(
                "cat Work.pkg/notes.txt Flat.txt && ls Work.pkg && printf 'still\\n' > Work.pkg/new.txt && sync Work.pkg/new.txt",
                in: mount.path)
            #expect(rest.status == 0, "\(rest.error)")
            #expect(rest.output.hasPrefix(Fixture.notesText + Fixture.flatText), "\(rest.output)")
            let engine = try Engine(fixture)
            try await expectEventually("the new file in the store") {
                try engine.text("Work.pkg", "new.txt") == "still\n"
            }
        }
    }

    @Test("a mount is private to its user; with allow_other, default_permissions applies the modes")
    func privateMount() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            for command in ["ls", "stat Flat.txt", "cat Flat.txt"] {
                let result = try await sh("runuser -u nobody -- \(command)", in: mount.path)
                #expect(
                    result.status != 0 && result.error.contains("Permission denied"), "\(command): \(result)")
            }
            // The owner is let in, of course.
            #expect(try await sh("cat Flat.txt", in: mount.path).status == 0)
        }
        try await withMount(fixture.store, configure: { $0.allowOther = true }) { mount in
            _ = try await offThread { try sys(chmod(mount.url("Work.pkg/notes.txt"), 0o600), "chmod") }
            let allowed = try await sh(
                "runuser -u nobody -- sh -c 'ls >/dev/null && cat Flat.txt Work.pkg/sub/inner.txt'",
                in: mount.path)
            #expect(allowed.status == 0, "\(allowed)")
            let denied = try await sh("runuser -u nobody -- cat Work.pkg/notes.txt", in: mount.path)
            #expect(denied.status != 0 && denied.error.contains("Permission denied"), "\(denied)")
            let xattr = try await sh(
                "runuser -u nobody -- getfattr -n user.color Work.pkg/notes.txt", in: mount.path)
            #expect(xattr.status != 0, "\(xattr)")
        }
    }
}

/// A path component over 255 bytes is ENAMETOOLONG on every operation, as on ext4: lookups,
/// removals and renames of such a name included, not ENOENT.
@Suite struct LongNameTests {
    @Test(
        "stat, chmod, truncate, rename, unlink, rmdir and open of a 256-byte name: ENAMETOOLONG, in a package and at the root",
        arguments: StoreKind.all)
    func longNamesOnEveryOperation(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let long = String(repeating: "n", count: 256)
            for directory in [mount.url("Work.pkg"), mount.path] {
                let path = directory + "/" + long
                let other = directory + "/short"
                let results = await offThreadErrors([
                    (
                        "stat",
                        {
                            var st = stat()
                            return stat(path, &st)
                        }
                    ),
                    (
                        "lstat",
                        {
                            var st = stat()
                            return lstat(path, &st)
                        }
                    ),
                    ("chmod", { chmod(path, 0o600) }),
                    ("truncate", { truncate(path, 0) }),
                    ("rename from", { rename(path, other) }),
                    ("unlink", { unlink(path) }),
                    ("rmdir", { rmdir(path) }),
                    ("open", { open(path, O_RDONLY) }),
                    ("access", { access(path, F_OK) }),
                ])
                for (operation, error) in results {
                    #expect(error == ENAMETOOLONG, "\(operation) in \(directory): errno \(error)")
                }
            }
        }
    }
}

/// Runs each call off the cooperative pool; the errno of each (0 when it succeeded).
func offThreadErrors(_ calls: [(String, @Sendable () -> Int32)]) async -> [(String, Int32)] {
    await withCheckedContinuation { continuation in
        Thread.detachNewThread {
            continuation.resume(returning: calls.map { name, call in (name, call() < 0 ? errno : 0) })
        }
    }
}
