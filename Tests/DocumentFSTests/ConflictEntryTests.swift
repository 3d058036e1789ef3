import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Unresolved conflict versions (FV-1) as entries at the mount root, `name (conflict N).ext`:
/// a user opens them to compare, removes one to keep the current version, or renames it onto
/// the document to keep it instead.
@MainActor
@Suite(.serialized)
struct ConflictEntryTests {
    /// Saves `text` into the file at `path` of a document twice from the same base: the first
    /// save becomes current, the second (`conflictText`) a conflict version, which is returned.
    static func makeConflict(
        _ engine: Engine, _ name: String, _ path: String = "", current: String, conflict conflictText: String
    ) throws -> VersionID {
        let info = try engine.document(name)
        let record = try #require(try engine.record(name, path))
        func save(_ text: String) throws -> SaveResult {
            var changes = DocumentChanges(document: info.id, base: info.currentVersion)
            var changed = record
            changed.modified = .now
            changes.nodes = [changed]
            changes.contents = [record.id: .replace(DataContentsSource(Data(text.utf8)))]
            changes.origin = "another machine"
            changes.conflictPolicy = .keepBoth
            return try engine.store.save(changes)
        }
        #expect(try save(current).isConflict == false)
        let lost = try save(conflictText)
        #expect(lost.isConflict)
        return lost.version.id
    }

    /// The small fixture with a conflict on Work.pkg/notes.txt ("lost" against "current") and,
    /// unless `flat` is false, one on Flat.txt ("flat lost" against "flat current").
    static func conflicted(_ kind: StoreKind, flat: Bool = true) throws
        -> (fixture: Fixture, engine: Engine, work: VersionID, flat: VersionID?)
    {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let work = try makeConflict(engine, "Work.pkg", "notes.txt", current: "current\n", conflict: "lost\n")
        let flatVersion =
            flat
            ? try makeConflict(engine, "Flat.txt", current: "flat current\n", conflict: "flat lost\n") : nil
        return (fixture, engine, work, flatVersion)
    }

    @Test(
        "a conflict version shows beside its document, read-only, with that version's files and bytes",
        arguments: StoreKind.all)
    func shown(_ kind: StoreKind) async throws {
        // One conflict before the mount (its first listing shows it), one while it runs (the
        // observer shows it).
        let (fixture, engine, work, _) = try Self.conflicted(kind, flat: false)
        defer { fixture.remove() }
        let workEntry = "Work (conflict \(work.rawValue)).pkg"
        let inode = try await withMount(fixture.store) { mount in
            let flat = try Self.makeConflict(
                engine, "Flat.txt", current: "flat current\n", conflict: "flat lost\n")
            let flatEntry = "Flat (conflict \(flat.rawValue)).txt"
            let listed = try await waitUntil(timeout: 3) { try entries(in: mount.path).contains(flatEntry) }
            #expect(listed != nil, "\((try? entries(in: mount.path)) ?? [])")
            #expect(
                try entries(in: mount.path)
                    == ["Flat.txt", "Other.pkg", "Work.pkg", flatEntry, workEntry].sorted())

            // The documents show their current versions, the entries the versions that lost.
            #expect(try readText(mount.url("Flat.txt")) == "flat current\n")
            #expect(try readText(mount.url(flatEntry)) == "flat lost\n")
            #expect(try readText(mount.url("Work.pkg/notes.txt")) == "current\n")
            #expect(try readText(mount.url(workEntry + "/notes.txt")) == "lost\n")
            #expect(try readText(mount.url(workEntry + "/sub/inner.txt")) == Fixture.innerText)
            let tree = try await sh("cd \(quoted(workEntry)) && find . | sort", in: mount.path)
            #expect(tree.output == ".\n./link\n./notes.txt\n./sub\n./sub/inner.txt\n", "\(tree)")
            #expect(try String(contentsOfFile: mount.url(workEntry + "/link"), encoding: .utf8) == "lost\n")
            let xattr = try await sh(
                "getfattr --only-values -n user.color \(quoted(workEntry))/notes.txt", in: mount.path)
            #expect(xattr.output == "blue", "\(xattr)")

            // Read-only, with inode numbers of their own.
            let entryStat = try statOf(mount.url(flatEntry))
            #expect(entryStat.st_mode & 0o222 == 0)
            #expect(try statOf(mount.url(workEntry + "/notes.txt")).st_mode & 0o7777 == 0o440)
            #expect(try statOf(mount.url(workEntry)).st_mode & 0o7777 == 0o755)
            #expect(entryStat.st_ino != (try statOf(mount.url("Flat.txt")).st_ino))
            #expect(
                (try statOf(mount.url(workEntry + "/notes.txt")).st_ino)
                    != (try statOf(mount.url("Work.pkg/notes.txt")).st_ino))
            try await offThread {
                #expect(errnoOf(open(mount.url(flatEntry), O_WRONLY)) == EACCES)
                #expect(errnoOf(open(mount.url(workEntry + "/notes.txt"), O_RDWR | O_TRUNC)) == EACCES)
                #expect(errnoOf(open(mount.url(workEntry + "/new.txt"), O_WRONLY | O_CREAT, 0o644)) == EACCES)
                #expect(errnoOf(mkdir(mount.url(workEntry + "/dir"), 0o755)) == EACCES)
                #expect(errnoOf(chmod(mount.url(flatEntry), 0o666)) == EACCES)
                #expect(errnoOf(truncate(mount.url(workEntry + "/notes.txt"), 0)) == EACCES)
                // Nothing else can take an entry's name.
                #expect(errnoOf(rename(mount.url("Flat.txt"), mount.url(flatEntry))) == EPERM)
                #expect(errnoOf(open(mount.url(flatEntry), O_WRONLY | O_CREAT | O_EXCL, 0o644)) == EEXIST)
            }
            let setfattr = try await sh("setfattr -n user.x -v 1 \(quoted(flatEntry))", in: mount.path)
            #expect(setfattr.status != 0 && setfattr.error.contains("Permission denied"), "\(setfattr)")
            // Nothing of that reached the store: both are still unresolved, the store unchanged.
            #expect(try engine.store.unresolvedConflicts().map(\.id) == [work, flat])
            #expect(try engine.text("Flat.txt") == "flat current\n")
            return try statOf(mount.url(workEntry + "/notes.txt")).st_ino
        }
        // A remount shows them again, with the same inode numbers.
        try await withMount(fixture.store) { mount in
            let names = try entries(in: mount.path)
            #expect(names.contains(workEntry), "\(names)")
            #expect(try statOf(mount.url(workEntry + "/notes.txt")).st_ino == inode)
        }
    }

    @Test(
        "rm of a conflict entry, or rm -r of a package's, resolves it and keeps the current version",
        arguments: StoreKind.all)
    func removing(_ kind: StoreKind) async throws {
        let (fixture, engine, work, flatVersion) = try Self.conflicted(kind)
        defer { fixture.remove() }
        let flat = try #require(flatVersion)
        try await withMount(fixture.store) { mount in
            let workEntry = "Work (conflict \(work.rawValue)).pkg"
            let flatEntry = "Flat (conflict \(flat.rawValue)).txt"
            // Removing inside an entry only hides (so that rm -r gets to the rmdir): nothing else.
            #expect(
                try await sh("rm \(quoted(workEntry))/sub/inner.txt </dev/null", in: mount.path).status == 0)
            #expect(try await sh("rmdir \(quoted(workEntry))", in: mount.path).status != 0)
            #expect(try engine.store.unresolvedConflicts().map(\.id) == [work, flat])

            let removed = try await sh(
                "rm \(quoted(flatEntry)) </dev/null && rm -r \(quoted(workEntry)) </dev/null", in: mount.path)
            #expect(removed.status == 0, "\(removed)")
            #expect(try entries(in: mount.path) == ["Flat.txt", "Other.pkg", "Work.pkg"])
            #expect(try engine.store.unresolvedConflicts().isEmpty)
            for (name, id) in [("Flat.txt", flat), ("Work.pkg", work)] {
                let version = try #require(try engine.versions(name).first { $0.id == id })
                #expect(version.isConflict && version.isResolved, "\(version)")
            }
            #expect(try engine.text("Flat.txt") == "flat current\n")
            #expect(try engine.text("Work.pkg", "notes.txt") == "current\n")
            #expect(try engine.text("Work.pkg", "sub/inner.txt") == Fixture.innerText)
            #expect(try readText(mount.url("Flat.txt")) == "flat current\n")
        }
        // Resolved stays resolved.
        try await withMount(fixture.store) { mount in
            let names = try entries(in: mount.path)
            #expect(names == ["Flat.txt", "Other.pkg", "Work.pkg"])
        }
    }

    @Test("a listing of the store's conflicts read before this mount resolves one does not show it again")
    func resolvedWhileTheObserverLists() async throws {
        // CI once saw `rm -r` of an entry succeed and the entry still listed: the observer's
        // listing, prompted by the resolve just before, had read the store before this resolve.
        let (fixture, _, work, flatVersion) = try Self.conflicted(.memory)
        defer { fixture.remove() }
        let flat = try #require(flatVersion)
        let proxy = ProxyStore(fixture.store)
        try await withMount(proxy) { mount async throws in
            let workEntry = "Work (conflict \(work.rawValue)).pkg"
            let flatEntry = "Flat (conflict \(flat.rawValue)).txt"
            #expect(try entries(in: mount.path).contains(workEntry))
            proxy.holdConflictListings()
            defer { proxy.releaseConflictListings() }
            // Resolving one makes the observer list the conflicts; that listing, which still has
            // the other one, waits while the other is resolved.
            #expect(try await sh("rm \(quoted(flatEntry)) </dev/null", in: mount.path).status == 0)
            #expect(eventually(timeout: 10) { proxy.heldConflictListings == 1 } != nil)
            #expect(try await sh("rm -r \(quoted(workEntry)) </dev/null", in: mount.path).status == 0)
            proxy.passConflictListing()
            // The next listing (a retry, or the next event's) is held: whatever the stale one did
            // shows now.
            #expect(eventually(timeout: 10) { proxy.heldConflictListings == 2 } != nil)
            #expect(try entries(in: mount.path) == ["Flat.txt", "Other.pkg", "Work.pkg"])
            proxy.releaseConflictListings()
            #expect(try fixture.store.unresolvedConflicts().isEmpty)
        }
    }

    @Test(
        "mv of a conflict entry onto its document keeps that version; a rename to another name keeps both and resolves",
        arguments: StoreKind.all)
    func keeping(_ kind: StoreKind) async throws {
        let (fixture, engine, work, flatVersion) = try Self.conflicted(kind)
        defer { fixture.remove() }
        let flat = try #require(flatVersion)
        let flatID = try engine.document("Flat.txt").id
        let versionsBefore = try engine.versions("Flat.txt").count
        try await withMount(fixture.store) { mount in
            let workEntry = "Work (conflict \(work.rawValue)).pkg"
            let flatEntry = "Flat (conflict \(flat.rawValue)).txt"
            // A change the mount has not saved yet (a chmod waits for the quiet interval) is
            // saved first, so it stays in the history.
            let kept = try await sh(
                "chmod 600 Work.pkg/sub/inner.txt && mv \(quoted(flatEntry)) Flat.txt && cat Flat.txt && mv -T \(quoted(workEntry)) Work.pkg && cat Work.pkg/notes.txt",
                in: mount.path)
            #expect(kept.status == 0, "\(kept)")
            #expect(kept.output == "flat lost\nlost\n", "\(kept)")
            #expect(try entries(in: mount.path) == ["Flat.txt", "Other.pkg", "Work.pkg"])
            #expect(try readText(mount.url("Flat.txt")) == "flat lost\n")
            #expect(try readText(mount.url("Work.pkg/notes.txt")) == "lost\n")
            #expect(try readText(mount.url("Work.pkg/sub/inner.txt")) == Fixture.innerText)
            // In the store: the same documents, one new version each, the conflicts resolved.
            #expect(try engine.document("Flat.txt").id == flatID)
            #expect(try engine.text("Flat.txt") == "flat lost\n")
            #expect(try engine.text("Work.pkg", "notes.txt") == "lost\n")
            #expect(try engine.versions("Flat.txt").count == versionsBefore + 1)
            #expect(try engine.store.unresolvedConflicts().isEmpty)
            let modes = try engine.versions("Work.pkg").compactMap {
                try engine.tree("Work.pkg", at: $0.id)["sub/inner.txt"]?.permissions
            }
            #expect(modes.contains(0o600), "\(modes)")
            #expect(try engine.record("Work.pkg", "sub/inner.txt")?.permissions == 0o644)
            #expect(
                try engine.document("Work.pkg").currentVersion == (try engine.versions("Work.pkg").last?.id))

            // Elsewhere at the root: rename(2) keeps both, the conflict version as a new document,
            // and resolves the conflict, in one step (no EXDEV).
            let again = try Self.makeConflict(
                engine, "Flat.txt", current: "newest\n", conflict: "lost again\n")
            let againEntry = "Flat (conflict \(again.rawValue)).txt"
            #expect(
                try await waitUntil(timeout: 3) { try entries(in: mount.path).contains(againEntry) } != nil)
            // The listing (with the entry) is refreshed before the document is reloaded.
            #expect(
                try await waitUntil(timeout: 3) { try readText(mount.url("Flat.txt")) == "newest\n" } != nil)
            let p = mount.path
            #expect(try await offThread { errnoOf(rename(p + "/" + againEntry, p + "/Copy.txt")) } == 0)
            #expect(try readText(mount.url("Copy.txt")) == "lost again\n")
            #expect(try readText(mount.url("Flat.txt")) == "newest\n")
            #expect(try engine.text("Copy.txt") == "lost again\n")
            #expect(try engine.store.unresolvedConflicts().isEmpty)
            #expect(try entries(in: mount.path) == ["Copy.txt", "Flat.txt", "Other.pkg", "Work.pkg"])

            // Into a package: the conflict version becomes a wrapper there, in one step too.
            let third = try Self.makeConflict(
                engine, "Flat.txt", current: "newest again\n", conflict: "lost thrice\n")
            let thirdEntry = "Flat (conflict \(third.rawValue)).txt"
            #expect(
                try await waitUntil(timeout: 3) { try entries(in: mount.path).contains(thirdEntry) } != nil)
            #expect(
                try await offThread { errnoOf(rename(p + "/" + thirdEntry, p + "/Work.pkg/kept.txt")) } == 0)
            #expect(try readText(mount.url("Work.pkg/kept.txt")) == "lost thrice\n")
            #expect(try engine.text("Work.pkg", "kept.txt") == "lost thrice\n")
            #expect(try engine.store.unresolvedConflicts().isEmpty)
            #expect(try entries(in: mount.path) == ["Copy.txt", "Flat.txt", "Other.pkg", "Work.pkg"])
        }
    }

    @Test(
        "another process resolving or renaming shows within a second; a document keeps its name over an entry",
        arguments: StoreKind.all)
    func followsOthers(_ kind: StoreKind) async throws {
        let (fixture, engine, work, flatVersion) = try Self.conflicted(kind)
        defer { fixture.remove() }
        let flat = try #require(flatVersion)
        try await withMount(fixture.store) { mount in
            let flatEntry = "Flat (conflict \(flat.rawValue)).txt"
            #expect(try entries(in: mount.path).contains(flatEntry))
            // Renamed elsewhere: the entry follows the document's name.
            _ = try engine.store.renameDocument(try engine.document("Flat.txt").id, to: "Renamed.md")
            let renamed = "Renamed (conflict \(flat.rawValue)).md"
            #expect(
                try await waitUntil(timeout: 3) {
                    let names = try entries(in: mount.path)
                    return names.contains(renamed) && !names.contains(flatEntry)
                } != nil, "\((try? entries(in: mount.path)) ?? [])")
            #expect(try readText(mount.url(renamed)) == "flat lost\n")
            // Resolved elsewhere: gone.
            try engine.store.resolveConflict(flat)
            #expect(
                try await waitUntil(timeout: 3) { !(try entries(in: mount.path).contains(renamed)) } != nil)
            // A document created under an entry's name is shown instead of the entry.
            let workEntry = "Work (conflict \(work.rawValue)).pkg"
            #expect(try entries(in: mount.path).contains(workEntry))
            _ = try engine.store.createDocument(
                named: workEntry, kind: .flat, type: nil, permissions: 0o644, origin: "test")
            #expect(
                try await waitUntil(timeout: 3) {
                    var st = stat()
                    return lstat(mount.url(workEntry), &st) == 0 && st.st_mode & S_IFMT == S_IFREG
                } != nil)
            #expect(try engine.store.unresolvedConflicts().map(\.id) == [work])
        }
    }
}
