import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The desktop: the history under `.docfs/versions`, and the XDG trash that is the
/// store's Trash, driven by GIO's real trash backend (gvfsd-trash on a session bus of its own).
@Suite(.serialized)
struct DesktopTests {
    /// Runs `script` with GIO's daemons on a private session bus; `$M` is the mount. The home
    /// trash is a fresh folder's, so that emptying the trash never touches the user's. Without
    /// gvfsd-fuse: it can outlive the bus with this script's output pipe open (seen once in a
    /// full run), and the tests need none of its mounts.
    func gio(_ script: String, _ mount: TestMount) async throws -> ProcessResult {
        let home = try temporaryDirectory("docfs-gio-home")
        defer { try? FileManager.default.removeItem(atPath: home) }
        return try await sh(
            """
            M=\(quoted(mount.path)) XDG_DATA_HOME=\(quoted(home)) XDG_CACHE_HOME=\(quoted(home)) \
            XDG_CONFIG_HOME=\(quoted(home)) GVFS_DISABLE_FUSE=1; \
            export M XDG_DATA_HOME XDG_CACHE_HOME XDG_CONFIG_HOME GVFS_DISABLE_FUSE; \
            dbus-run-session -- sh -c \(quoted(script)) 2>&1
            """, in: "/tmp")
    }

    /// `gio trash --list` as (trash URI, original path) pairs, for this mount (GIO lists the
    /// trash of every mount on the machine, other tests' included).
    func trashList(_ mount: TestMount) async throws -> [(uri: String, path: String)] {
        let listed = try await gio("gio trash --list", mount)
        return listed.output.split(separator: "\n").compactMap { line in
            let parts = line.split(separator: "\t", maxSplits: 1)
            guard parts.count == 2, parts[0].hasPrefix("trash:"), parts[1].hasPrefix(mount.path + "/") else {
                return nil
            }
            return (String(parts[0]), String(parts[1]))
        }
    }

    @Test(
        "history: .docfs is reachable but not listed; every kept version reads as it was, read-only; deleted documents too",
        arguments: StoreKind.all)
    func history(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            // Two more versions of Flat.txt, and one of Work.pkg's notes.
            for text in ["second\n", "third\n"] {
                try await offThread { try writeText(mount.url("Flat.txt"), text) }
                _ = try await waitUntil(timeout: 3) { try engine.text("Flat.txt") == text }
            }
            try await offThread { try writeText(mount.url("Work.pkg/notes.txt"), "changed notes\n") }
            _ = try await waitUntil(timeout: 3) {
                try engine.text("Work.pkg", "notes.txt") == "changed notes\n"
            }
            let root = try await offThread { try entries(in: mount.path) }
            #expect(!root.contains(".docfs"), "\(root)")
            let versions = try await offThread { try entries(in: mount.url(".docfs/versions")) }
            #expect(Set(versions).isSuperset(of: ["Flat.txt", "Work.pkg", "Other.pkg"]), "\(versions)")

            // Flat.txt: a file per version, oldest first, named by time and id, reading as saved.
            let flat = try await offThread { try entries(in: mount.url(".docfs/versions/Flat.txt")).sorted() }
            let stored = try engine.versions("Flat.txt")
            #expect(flat.count == stored.count, "\(flat)")
            for name in flat {
                #expect(
                    name.range(
                        of: #"^\d{4}-\d\d-\d\d \d\d\.\d\d\.\d\d v\d+\.txt$"#, options: .regularExpression)
                        != nil, "\(name)")
            }
            let texts = try await offThread {
                try flat.map {
                    try String(contentsOfFile: mount.url(".docfs/versions/Flat.txt/\($0)"), encoding: .utf8)
                }
            }
            #expect(
                texts.contains(Fixture.flatText) && texts.contains("second\n") && texts.last == "third\n",
                "\(texts)")
            let versionIDs = flat.compactMap { name in
                name.split(separator: " ").last.flatMap { Int($0.dropFirst().split(separator: ".")[0]) }
            }
            #expect(versionIDs == versionIDs.sorted(), "entries sort by time and version: \(flat)")

            // Work.pkg: a folder per version (the first, empty, from its creation); one before the
            // change has the old notes, the newest the new ones.
            let package = try await offThread {
                try entries(in: mount.url(".docfs/versions/Work.pkg")).sorted()
            }
            let notes = try await offThread {
                package.map {
                    (try? String(
                        contentsOfFile: mount.url(".docfs/versions/Work.pkg/\($0)/notes.txt"), encoding: .utf8
                    ))
                }
            }
            #expect(notes.last == "changed notes\n", "\(package) \(notes)")
            let before = try #require(
                package.indices.first { notes[$0] == Fixture.notesText }, "\(package) \(notes)")
            let oldest = mount.url(".docfs/versions/Work.pkg/" + package[before])
            // cp and diff work on it; nothing in it can change.
            let tools = try await sh(
                """
                cp -r \(quoted(oldest)) copy.pkg && diff -r \(quoted(oldest)) copy.pkg && \
                ! diff -q \(quoted(oldest))/notes.txt Work.pkg/notes.txt >/dev/null
                """, in: mount.path)
            #expect(tools.status == 0, "\(tools.output) \(tools.error)")
            let refused = try await offThread {
                (
                    errnoOf(open(oldest + "/notes.txt", O_WRONLY)), errnoOf(unlink(oldest + "/notes.txt")),
                    errnoOf(mkdir(oldest + "/new", 0o755)), errnoOf(rename(oldest, mount.url("Back.pkg"))),
                    errnoOf(mkdir(mount.url(".docfs/versions/New"), 0o755))
                )
            }
            #expect(refused.0 == EACCES || refused.0 == EROFS, "open for writing: \(refused.0)")
            #expect(refused.1 == EROFS || refused.1 == EACCES, "unlink: \(refused.1)")
            #expect(refused.2 == EROFS || refused.2 == EACCES, "mkdir: \(refused.2)")
            #expect(refused.3 != 0, "rename out of the history")
            #expect(refused.4 == EROFS, "mkdir in .docfs: \(refused.4)")
            // find and du of the mount do not walk the history.
            let walked = try await sh("find . | grep -c docfs/versions || true", in: mount.path)
            #expect(walked.output.trimmingCharacters(in: .whitespacesAndNewlines) == "0")

            // A deleted document's versions stay in the history.
            try await offThread { try sys(unlink(mount.url("Flat.txt"))) }
            let afterDelete = try await offThread { try entries(in: mount.url(".docfs/versions/Flat.txt")) }
            #expect(afterDelete.count >= flat.count, "\(afterDelete)")
            let last = try await offThread {
                try String(
                    contentsOfFile: mount.url(".docfs/versions/Flat.txt/" + flat.last!), encoding: .utf8)
            }
            #expect(last == "third\n")
        }
        #expect(try engine.documentNames().allSatisfy { !$0.hasPrefix(".docfs") })
    }

    @Test(
        "gio trash of a wrapper and a document: listed with original paths and dates, restored intact, emptied; never stored as .Trash-0",
        arguments: StoreKind.all)
    func trash(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let workVersions = try engine.versions("Work.pkg").count
        try await withMount(fixture.store) { mount in
            let trashed = try await gio(
                #"gio trash "$M/Work.pkg/sub" "$M/Work.pkg/notes.txt" "$M/Flat.txt" && gio list "$M/Work.pkg""#,
                mount)
            #expect(trashed.status == 0, "\(trashed.output)")
            #expect(
                !trashed.output.contains("notes.txt") && trashed.output.contains("link"), "\(trashed.output)")
            // Each left its place as one new version; the document went as a deletion.
            #expect(try engine.versions("Work.pkg").count == workVersions + 2)
            #expect(try !engine.paths("Work.pkg").contains("notes.txt"))
            #expect(try !engine.documentNames().contains("Flat.txt"))
            #expect(try fixture.store.deletedDocuments().map(\.name) == ["Flat.txt"])
            #expect(try !engine.documentNames().contains { $0.hasPrefix(".Trash") })

            // Listed at their original paths, with their deletion dates.
            let list = try await trashList(mount)
            #expect(
                Set(list.map(\.path)) == [
                    mount.url("Work.pkg/sub"), mount.url("Work.pkg/notes.txt"), mount.url("Flat.txt"),
                ], "\(list)")
            let info = try await offThread {
                try String(contentsOfFile: mount.url(".Trash-0/info/notes.txt.trashinfo"), encoding: .utf8)
            }
            #expect(info.hasPrefix("[Trash Info]\nPath=Work.pkg/notes.txt\nDeletionDate=2"), "\(info)")
            let inTrash = try await offThread {
                try String(contentsOfFile: mount.url(".Trash-0/files/sub/inner.txt"), encoding: .utf8)
            }
            #expect(inTrash == Fixture.innerText)
            let deletedList = try await sh("ls -la .Trash-0/files", in: mount.path)
            #expect(deletedList.output.contains("Flat.txt"))

            // Restored intact, each as one new version.
            let before = try engine.versions("Work.pkg").count
            let restore = list.filter { $0.path.hasSuffix("notes.txt") || $0.path.hasSuffix("Flat.txt") }
                .map { "gio trash --restore \(quoted($0.uri))" }.joined(separator: " && ")
            let restored = try await gio(restore, mount)
            #expect(restored.status == 0, "\(restored.output)")
            #expect(try engine.text("Work.pkg", "notes.txt") == Fixture.notesText)
            #expect(
                try engine.record("Work.pkg", "notes.txt")?.extendedAttributes["user.color"]
                    == Data("blue".utf8))
            #expect(try engine.versions("Work.pkg").count == before + 1)
            #expect(try engine.text("Flat.txt") == Fixture.flatText)
            #expect(try fixture.store.deletedDocuments().isEmpty)
            let shown = try await offThread {
                try String(contentsOfFile: mount.url("Work.pkg/notes.txt"), encoding: .utf8)
            }
            #expect(shown == Fixture.notesText)
            #expect(try await trashList(mount).map(\.path) == [mount.url("Work.pkg/sub")])

            // Emptying drops it from the Trash; its history stays.
            // Emptied as `gio trash --empty` does, item by item through the trash backend (it
            // moves each to expunged/, then deletes it), but only this mount's items: --empty
            // would empty the trash of every mount on the machine.
            let left = try await trashList(mount)
            #expect(left.count == 1)
            let emptied = try await gio(
                left.map { "gio remove \(quoted($0.uri))" }.joined(separator: " && "), mount)
            #expect(emptied.status == 0, "\(emptied.output)")
            #expect(try await trashList(mount).isEmpty)
            #expect(try await offThread { try entries(in: mount.url(".Trash-0/files")) }.isEmpty)
            #expect(try !engine.paths("Work.pkg").contains("sub"))
            let history = try await offThread {
                try entries(in: mount.url(".docfs/versions/Work.pkg")).sorted()
            }
            let withSub = try await offThread {
                history.filter {
                    access(mount.url(".docfs/versions/Work.pkg/\($0)/sub/inner.txt"), F_OK) == 0
                }
            }
            #expect(!withSub.isEmpty, "the trashed folder's history is gone")
        }
        #expect(try fixture.store.trash().isEmpty)
        #expect(try fixture.store.checkIntegrity().isClean)
    }

    @Test(
        "docfs's deleted documents are the Trash's: a document deleted by the engine is in it, one restored from it is live",
        arguments: [StoreKind.sqlite])
    func trashAgreesWithStore(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let other = try #require(try fixture.store.document(named: "Other.pkg"))
        try fixture.store.deleteDocument(other.id, origin: "test")
        try await withMount(fixture.store) { mount in
            let files = try await offThread { try entries(in: mount.url(".Trash-0/files")) }
            #expect(files == ["Other.pkg"])
            let info = try await offThread {
                try String(contentsOfFile: mount.url(".Trash-0/info/Other.pkg.trashinfo"), encoding: .utf8)
            }
            #expect(info.contains("Path=Other.pkg\n"))
            // A plain mv out of the Trash restores too (trash-cli, file managers).
            try await offThread {
                try sys(rename(mount.url(".Trash-0/files/Other.pkg"), mount.url("Other.pkg")))
            }
            let restored = try await offThread {
                try String(contentsOfFile: mount.url("Other.pkg/other.txt"), encoding: .utf8)
            }
            #expect(restored == Fixture.otherText)
        }
        #expect(try fixture.store.document(named: "Other.pkg")?.id == other.id)
        #expect(try fixture.store.trash().isEmpty)
    }

    @Test("the trash folders' names are never documents; other users' trash is not there")
    func reservedNames() async throws {
        let fixture = try Fixture.small(.memory)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let results = try await offThread {
                (
                    errnoOf(mkdir(mount.url(".Trash"), 0o700)), errnoOf(mkdir(mount.url(".Trash-0"), 0o700)),
                    errnoOf(mkdir(mount.url(".Trash-4242"), 0o700)),
                    errnoOf(rename(mount.url("Other.pkg"), mount.url(".Trash-1000"))),
                    errnoOf(open(mount.url(".docfs"), O_CREAT | O_WRONLY, 0o644)),
                    access(mount.url(".Trash-4242"), F_OK)
                )
            }
            #expect(
                results.0 == EACCES && results.1 == EEXIST && results.2 == EACCES && results.3 == EACCES,
                "\(results)")
            #expect(results.4 == EISDIR || results.4 == EACCES || results.4 == EEXIST)
            #expect(results.5 == -1)
            var st = stat()
            #expect(lstat(mount.url(".Trash-0"), &st) == 0 && st.st_mode & 0o7777 == 0o700 && st.st_uid == 0)
        }
        #expect(try engine.documentNames() == ["Flat.txt", "Other.pkg", "Work.pkg"])
    }

    @Test(
        "a .Trash-0 document an older mount stored (GIO's failed trash) is renamed Trash-0 (old), its contents kept"
    )
    func legacyTrashDocument() async throws {
        let fixture = try Fixture.small(.memory)
        let info = try fixture.store.createDocument(
            named: ".Trash-0", kind: .package, type: nil, permissions: 0o700, origin: "an older docfs")
        try await withMount(fixture.store) { mount in
            let root = try await offThread { try entries(in: mount.path) }
            #expect(root.contains("Trash-0 (old)"), "\(root)")
            var st = stat()
            #expect(lstat(mount.url(".Trash-0"), &st) == 0 && st.st_mode & 0o7777 == 0o700)
            #expect(
                try await offThread { try entries(in: mount.url(".Trash-0")) }.sorted() == [
                    "expunged", "files", "info",
                ])
        }
        #expect(try fixture.store.document(info.id).name == "Trash-0 (old)")
    }

    @Test("gio copy and gio list work on the mount and on the history")
    func gioCopy() async throws {
        let fixture = try Fixture.small(.memory)
        try await withMount(fixture.store) { mount in
            let result = try await gio(
                #"gio copy "$M/Work.pkg/notes.txt" "$M/Other.pkg/copied.txt" && gio list "$M/Other.pkg" && gio list "$M/.docfs/versions/Flat.txt""#,
                mount)
            #expect(result.status == 0, "\(result.output)")
            #expect(result.output.contains("copied.txt") && result.output.contains(" v"), "\(result.output)")
            let copied = try await offThread {
                try String(contentsOfFile: mount.url("Other.pkg/copied.txt"), encoding: .utf8)
            }
            #expect(copied == Fixture.notesText)
        }
    }
}
