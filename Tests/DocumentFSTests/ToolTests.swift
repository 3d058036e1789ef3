import DocumentEngine
import DocumentFS
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Polls the engine (off the pool) until `condition` holds, up to 3 s, and records a failure
/// naming `what` if it never does. Structural changes (rename, unlink, mkdir, chmod, setxattr)
/// may be saved at once or at the end of the quiet interval; both are within the limit.
@discardableResult
func expectEventually(
    _ what: String, timeout: Double = 3, sourceLocation: SourceLocation = #_sourceLocation,
    _ condition: @escaping @Sendable () throws -> Bool
) async throws -> Bool {
    let took = try await waitUntil(timeout: timeout, condition)
    #expect(took != nil, "\(what) never happened", sourceLocation: sourceLocation)
    return took != nil
}

/// A small local tree (not on the mount) with modes, times, user xattrs, a symbolic link and a
/// subdirectory, as a source for cp -a, rsync and tar.
func makeLocalTree(_ root: String, bigSize: Int = 0) async throws {
    let script = """
        set -e
        mkdir -p tree/sub/deeper
        printf 'alpha\\n' > tree/a.txt
        printf 'secret\\n' > tree/private.txt
        printf '#!/bin/sh\\necho hi\\n' > tree/sub/run.sh
        printf 'deep\\n' > tree/sub/deeper/d.txt
        : > tree/empty
        ln -s sub/run.sh tree/run-link
        chmod 600 tree/private.txt; chmod 755 tree/sub/run.sh; chmod 750 tree/sub/deeper
        setfattr -n user.color -v blue tree/a.txt
        setfattr -n user.tag -v 'two words' tree/sub/run.sh
        \(bigSize > 0 ? "head -c \(bigSize) /dev/urandom > tree/big.bin" : ":")
        touch -h -d '2001-02-03 04:05:06.123456789' tree/a.txt tree/private.txt tree/run-link tree/empty
        touch -d '2002-03-04 05:06:07.5' tree/sub/run.sh tree/sub/deeper/d.txt
        touch -d '2003-04-05 06:07:08' tree/sub/deeper tree/sub tree
        """
    let result = try await sh(script, in: root)
    if result.status != 0 { throw TestFailure("making the local tree: \(result.error)") }
}

/// `stat` lines (relative name, type, mode, size, mtime with ns, symlink target) of a tree,
/// sorted, for comparing a copy with its source (directory sizes left out: they are the file
/// system's own).
func statLines(_ directory: String) async throws -> String {
    let result = try await sh(
        "find . -mindepth 1 -printf '%P %y %m %s %T@ %l\\n' | awk '$2 == \"d\" { $4 = \"-\" } 1' | sort",
        in: directory)
    if result.status != 0 { throw TestFailure("find: \(result.error)") }
    return result.output
}

/// How the store's records of a copy differ from the local tree it was copied from (kind, mode,
/// size, mtime to the nanosecond, link target, user xattrs); empty when they agree. `prefix` is
/// the copy's path in the document ("" when the copy is the document itself).
func storeDifferences(from local: String, _ engine: Engine, _ document: String, at prefix: String) throws
    -> [String]
{
    let tree = try engine.tree(document)
    var relatives = [""]
    if let enumerator = FileManager.default.enumerator(atPath: local) {
        while let relative = enumerator.nextObject() as? String { relatives.append(relative) }
    }
    var differences: [String] = []
    for relative in relatives {
        let path = relative.isEmpty ? prefix : (prefix.isEmpty ? relative : prefix + "/" + relative)
        guard let record = tree[path] else {
            differences.append("\(path): missing")
            continue
        }
        let st = try lstatOf(relative.isEmpty ? local : local + "/" + relative)
        let kind: FileWrapper.Kind =
            switch st.st_mode & S_IFMT {
            case S_IFDIR: .directory
            case S_IFLNK: .symbolicLink
            default: .regularFile
            }
        if record.kind != kind { differences.append("\(path): kind \(record.kind)") }
        if kind != .symbolicLink, record.permissions != Int(st.st_mode & 0o7777) {
            differences.append("\(path): mode \(String(record.permissions, radix: 8))")
        }
        if kind == .regularFile, record.size != Int64(st.st_size) {
            differences.append("\(path): size \(record.size)")
        }
        if FileTime(record.modified) != FileTime(st.st_mtim) {
            differences.append("\(path): mtime \(FileTime(record.modified)) not \(FileTime(st.st_mtim))")
        }
        if kind == .symbolicLink {
            let target = try FileManager.default.destinationOfSymbolicLink(atPath: local + "/" + relative)
            if record.linkTarget != target {
                differences.append("\(path): target \(String(describing: record.linkTarget))")
            }
        }
    }
    return differences
}

/// Polls until the store's records of a copy agree with the local tree (the metadata of a copy
/// may wait for the quiet interval), then expects that they do.
func expectStoreMatches(
    _ local: String, _ engine: Engine, _ document: String, at prefix: String,
    sourceLocation: SourceLocation = #_sourceLocation
) async throws {
    _ = try await waitUntil(timeout: 4) {
        try storeDifferences(from: local, engine, document, at: prefix).isEmpty
    }
    let differences = try await offThread { try storeDifferences(from: local, engine, document, at: prefix) }
    #expect(differences == [], "\(document)/\(prefix)", sourceLocation: sourceLocation)
}

/// `getfattr -d` of a tree (user. names), for comparing a copy with its source.
func xattrDump(_ directory: String) async throws -> String {
    let result = try await sh(
        "find . -mindepth 1 | sort | xargs -d '\\n' getfattr -h -d 2>/dev/null", in: directory)
    return result.output
}

/// Everyday tools on the mount (cp, mv, rm, touch, truncate, ln, rsync, tar, getfattr/setfattr,
/// gio): each result is checked in the mount and through the engine (a second store
/// connection).
@Suite(.serialized)
struct ToolTests {
    // MARK: cp

    @Test("cp makes a new wrapper and overwrites an existing one in place")
    func cp() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let local = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: local) }
        try "copied\n".write(toFile: local + "/src.txt", atomically: false, encoding: .utf8)
        try "overwritten\n".write(toFile: local + "/over.txt", atomically: false, encoding: .utf8)
        let engine = try Engine(fixture)
        let notes = try #require(try engine.record("Work.pkg", "notes.txt"))
        try await withMount(fixture.store) { mount in
            let result = try await sh(
                "cp \(local)/src.txt Work.pkg/new.txt && cp \(local)/over.txt Work.pkg/notes.txt"
                    + " && cp \(local)/src.txt New.txt",
                in: mount.path)
            #expect(result.status == 0, "\(result.error)")
            // cp's close is a save point: the store has it when cp has exited.
            #expect(try engine.text("Work.pkg", "new.txt") == "copied\n")
            #expect(try engine.text("Work.pkg", "notes.txt") == "overwritten\n")
            // Overwritten in place: the same wrapper, with its mode and xattrs.
            let after = try #require(try engine.record("Work.pkg", "notes.txt"))
            #expect(after.id == notes.id)
            #expect(after.permissions == 0o640)
            #expect(after.extendedAttributes["user.color"] == Data("blue".utf8))
            // At the root, a created file is a flat document.
            let created = try engine.document("New.txt")
            #expect(created.kind == .flat)
            #expect(try engine.text("New.txt") == "copied\n")
            #expect(try await sh("cat Work.pkg/new.txt New.txt", in: mount.path).output == "copied\ncopied\n")
        }
    }

    @Test("cp -a into a package and as a new package document keeps modes, times, xattrs and links")
    func cpArchive() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let local = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: local) }
        try await makeLocalTree(local)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let result = try await sh(
                "cp -a \(local)/tree Work.pkg/tree && cp -a \(local)/tree Copied.pkg", in: mount.path)
            #expect(result.status == 0, "\(result.error)")
            let source = try await statLines(local + "/tree")
            #expect(source.contains("a.txt f 644 6 981173106.1234567890"), "\(source)")
            let sourceXattrs = try await xattrDump(local + "/tree")
            #expect(sourceXattrs.contains("user.tag=\"two words\""), "\(sourceXattrs)")
            for copy in ["Work.pkg/tree", "Copied.pkg"] {
                #expect(try await statLines(mount.url(copy)) == source, "\(copy)")
                #expect(try await xattrDump(mount.url(copy)) == sourceXattrs, "\(copy)")
            }
            // Through the engine: a package document, and the same records in both copies.
            #expect(try engine.document("Copied.pkg").kind == .package)
            try await expectStoreMatches(local + "/tree", engine, "Work.pkg", at: "tree")
            try await expectStoreMatches(local + "/tree", engine, "Copied.pkg", at: "")
            for (document, prefix) in [("Work.pkg", "tree/"), ("Copied.pkg", "")] {
                let tree = try engine.tree(document)
                let a = try #require(tree[prefix + "a.txt"])
                #expect(a.permissions == 0o644 && a.size == 6)
                #expect(
                    FileTime(a.modified)
                        == FileTime(Timestamp(seconds: 981_173_106, nanoseconds: 123_456_789)))
                #expect(a.extendedAttributes == ["user.color": Data("blue".utf8)])
                #expect(tree[prefix + "private.txt"]?.permissions == 0o600)
                #expect(tree[prefix + "sub/run.sh"]?.permissions == 0o755)
                #expect(tree[prefix + "sub/run.sh"]?.extendedAttributes["user.tag"] == Data("two words".utf8))
                #expect(tree[prefix + "sub/deeper"]?.kind == .directory)
                #expect(tree[prefix + "sub/deeper"]?.permissions == 0o750)
                #expect(tree[prefix + "empty"]?.size == 0)
                let link = try #require(tree[prefix + "run-link"])
                #expect(link.kind == .symbolicLink && link.linkTarget == "sub/run.sh")
                #expect(try engine.text(document, prefix + "sub/run.sh") == "#!/bin/sh\necho hi\n")
            }
        }
    }

    @Test(
        "cp and dd of a 3 MiB file with odd block sizes, and a dd conv=notrunc patch, are byte-identical in the store"
    )
    func bigCopies() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let local = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: local) }
        let bytes = sampleBytes(3 * 1024 * 1024 + 12345, seed: 11)
        try bytes.write(to: URL(fileURLWithPath: local + "/big.bin"))
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let copied = try await sh(
                "cp \(local)/big.bin Work.pkg/cp.bin && dd if=\(local)/big.bin of=Work.pkg/dd.bin bs=7777 2>/dev/null"
                    + " && cp \(local)/big.bin Big.bin"
                    + " && printf 'PATCH' | dd of=Work.pkg/dd.bin bs=1 seek=1048570 conv=notrunc 2>/dev/null",
                in: mount.path)
            #expect(copied.status == 0, "\(copied.error)")
            var patched = bytes
            patched.replaceSubrange(1_048_570..<1_048_575, with: Data("PATCH".utf8))
            let expected = patched
            try await expectEventually("the copies in the store") {
                try engine.contents("Work.pkg", "cp.bin") == bytes
                    && engine.contents("Work.pkg", "dd.bin") == expected
                    && engine.contents("Big.bin") == bytes
            }
            let back = try await shBytes("cat Work.pkg/dd.bin", in: mount.path)
            #expect(back == patched)
        }
        #expect(try engine.store.checkIntegrity().isClean)
    }

    // MARK: mv

    @Test("mv renames in a directory, over an existing file, and between directories of a package")
    func mvInsideAPackage() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let notes = try #require(try engine.record("Work.pkg", "notes.txt"))
        let inner = try #require(try engine.record("Work.pkg", "sub/inner.txt"))
        try await withMount(fixture.store) { mount in
            let renamed = try await sh("mv Work.pkg/notes.txt Work.pkg/renamed.txt", in: mount.path)
            #expect(renamed.status == 0, "\(renamed.error)")
            try await expectEventually("the rename") {
                try engine.record("Work.pkg", "renamed.txt")?.id == notes.id
                    && engine.record("Work.pkg", "notes.txt") == nil
            }
            // Over an existing file, from another directory of the same package.
            let over = try await sh("mv Work.pkg/sub/inner.txt Work.pkg/renamed.txt", in: mount.path)
            #expect(over.status == 0, "\(over.error)")
            try await expectEventually("the rename over renamed.txt") {
                try engine.text("Work.pkg", "renamed.txt") == Fixture.innerText
                    && engine.record("Work.pkg", "sub/inner.txt") == nil
            }
            #expect(try engine.record("Work.pkg", "renamed.txt")?.id == inner.id)
            // Into a directory.
            let into = try await sh("mv Work.pkg/renamed.txt Work.pkg/sub/", in: mount.path)
            #expect(into.status == 0, "\(into.error)")
            try await expectEventually("the move into sub/") {
                try engine.record("Work.pkg", "sub/renamed.txt")?.id == inner.id
            }
            #expect(try engine.paths("Work.pkg") == ["link", "sub", "sub/renamed.txt"])
            #expect(try await sh("cat Work.pkg/sub/renamed.txt", in: mount.path).output == Fixture.innerText)
        }
    }

    @Test("mv between two documents and between a package and the root falls back to copy and delete (EXDEV)")
    func mvAcrossDocuments() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let flat = try engine.document("Flat.txt")
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let moved = try await sh(
                "mv Work.pkg/notes.txt Other.pkg/ && mv Work.pkg/sub Other.pkg/ && mv Flat.txt Other.pkg/"
                    + " && mv Other.pkg/other.txt ./Moved.txt",
                in: p)
            #expect(moved.status == 0, "\(moved.error)")
            #expect(try await offThread { try entries(in: p + "/Work.pkg") } == ["link"])
            #expect(
                try await offThread { try entries(in: p + "/Other.pkg") } == ["Flat.txt", "notes.txt", "sub"])
            try await expectEventually("the moves reached the store") {
                try engine.paths("Other.pkg") == ["Flat.txt", "notes.txt", "sub", "sub/inner.txt"]
                    && engine.paths("Work.pkg") == ["link"]
                    && engine.store.document(named: "Moved.txt") != nil
                    && engine.store.document(named: "Flat.txt") == nil
            }
            #expect(try engine.text("Other.pkg", "notes.txt") == Fixture.notesText)
            #expect(try engine.text("Other.pkg", "sub/inner.txt") == Fixture.innerText)
            #expect(try engine.text("Other.pkg", "Flat.txt") == Fixture.flatText)
            #expect(try engine.text("Moved.txt") == Fixture.otherText)
            // mv's copy keeps the mode and the user xattrs.
            let notes = try #require(try engine.record("Other.pkg", "notes.txt"))
            #expect(notes.permissions == 0o640)
            #expect(notes.extendedAttributes["user.color"] == Data("blue".utf8))
            // The flat document moved into a package is deleted, and restorable.
            #expect(try engine.store.deletedDocuments().contains { $0.id == flat.id })
        }
    }

    @Test("mv at the root renames documents, keeping their identity")
    func mvDocuments() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let flat = try engine.document("Flat.txt")
        let work = try engine.document("Work.pkg")
        try await withMount(fixture.store) { mount in
            let result = try await sh("mv Flat.txt Renamed.txt && mv Work.pkg Job.pkg", in: mount.path)
            #expect(result.status == 0, "\(result.error)")
            try await expectEventually("the renames") {
                try engine.store.document(named: "Renamed.txt")?.id == flat.id
                    && engine.store.document(named: "Job.pkg")?.id == work.id
            }
            #expect(try engine.documentNames() == ["Job.pkg", "Other.pkg", "Renamed.txt"])
            #expect(try engine.text("Renamed.txt") == Fixture.flatText)
            #expect(
                try await offThread { try entries(in: mount.path) } == [
                    "Job.pkg", "Other.pkg", "Renamed.txt",
                ])
            #expect(try await sh("cat Job.pkg/notes.txt", in: mount.path).output == Fixture.notesText)
        }
    }

    // MARK: rm, mkdir

    @Test("rm and rm -r remove wrappers; at the root they delete documents, which stay restorable")
    func rm() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let work = try engine.document("Work.pkg")
        let flat = try engine.document("Flat.txt")
        try await withMount(fixture.store) { mount in
            let inside = try await sh("rm Other.pkg/other.txt && rm -r Work.pkg/sub", in: mount.path)
            #expect(inside.status == 0, "\(inside.error)")
            try await expectEventually("the removals inside packages") {
                try engine.paths("Other.pkg") == [] && engine.paths("Work.pkg") == ["link", "notes.txt"]
            }
            let documents = try await sh("rm -r Work.pkg && rm Flat.txt", in: mount.path)
            #expect(documents.status == 0, "\(documents.error)")
            #expect(try await offThread { try entries(in: mount.path) } == ["Other.pkg"])
            try await expectEventually("the deletions") { try engine.documentNames() == ["Other.pkg"] }
            let deleted = try engine.store.deletedDocuments()
            #expect(deleted.contains { $0.id == work.id } && deleted.contains { $0.id == flat.id })
            // Restorable with their last contents: rm -r removed the wrappers one by one, but
            // the store keeps the versions before.
            _ = try engine.store.undeleteDocument(flat.id, as: nil)
            #expect(try engine.text("Flat.txt") == Fixture.flatText)
            let versions = try engine.store.versions(of: work.id)
            let withNotes = versions.last { version in
                (try? engine.tree(of: work.id, at: version.id)["notes.txt"]) != nil
            }
            #expect(withNotes != nil)
            _ = try engine.store.undeleteDocument(work.id, as: "Restored.pkg")
            try await expectEventually("the restored documents in the mount") {
                let names = try FileManager.default.contentsOfDirectory(atPath: mount.path)
                return names.contains("Flat.txt") && names.contains("Restored.pkg")
            }
        }
    }

    @Test("mkdir at the root makes a package document; inside a package a directory")
    func mkdir() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let result = try await sh(
                "mkdir New.pkg && mkdir -m 700 New.pkg/a && mkdir -p New.pkg/a/b/c && echo x > New.pkg/a/b/c/x.txt"
                    + " && rm Work.pkg/sub/inner.txt && rmdir Work.pkg/sub",
                in: mount.path)
            #expect(result.status == 0, "\(result.error)")
            #expect(try engine.document("New.pkg").kind == .package)
            try await expectEventually("the new directories") {
                try engine.text("New.pkg", "a/b/c/x.txt") == "x\n"
                    && engine.paths("Work.pkg") == ["link", "notes.txt"]
            }
            #expect(try engine.record("New.pkg", "a")?.permissions == 0o700)
            #expect(try engine.record("New.pkg", "a/b")?.kind == .directory)
            let st = try await offThread { try lstatOf(mount.url("New.pkg/a")) }
            #expect(st.st_mode == S_IFDIR | 0o700)
            #expect(st.st_nlink == 3)
            // A non-empty directory is not removed.
            let notEmpty = try await sh("rmdir New.pkg/a", in: mount.path)
            #expect(notEmpty.status != 0 && notEmpty.error.contains("not empty"), "\(notEmpty.error)")
        }
    }

    // MARK: touch, truncate, ln

    @Test("touch sets times (to the nanosecond) and creates empty files")
    func touch() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let result = try await sh(
                "touch -m -d '2001-02-03 04:05:06.123456789' Work.pkg/notes.txt"
                    + " && touch -a -d '2004-05-06 07:08:09' Work.pkg/notes.txt"
                    + " && touch Work.pkg/empty.txt Empty.txt && touch -h -d '2005-01-01 00:00:00' Work.pkg/link",
                in: mount.path)
            #expect(result.status == 0, "\(result.error)")
            let shown = try await sh("stat -c '%Y.%y|%X' Work.pkg/notes.txt", in: mount.path)
            #expect(shown.output.hasPrefix("981173106.2001-02-03 04:05:06.123456789"), "\(shown.output)")
            #expect(shown.output.hasSuffix("|1083827289\n"), "\(shown.output)")
            let expected = FileTime(Timestamp(seconds: 981_173_106, nanoseconds: 123_456_789))
            try await expectEventually("the times in the store") {
                try engine.record("Work.pkg", "notes.txt").map { FileTime($0.modified) } == expected
                    && engine.record("Work.pkg", "link").map { $0.modified.seconds } == 1_104_537_600
            }
            #expect(try engine.record("Work.pkg", "notes.txt")?.accessed.seconds == 1_083_827_289)
            #expect(try engine.record("Work.pkg", "link").map { $0.modified.seconds } == 1_104_537_600)
            // touch of an existing file changes no contents.
            #expect(try engine.text("Work.pkg", "notes.txt") == Fixture.notesText)
            #expect(try engine.record("Work.pkg", "empty.txt")?.size == 0)
            #expect(try engine.document("Empty.txt").kind == .flat)
            #expect(try engine.text("Empty.txt") == "")
        }
    }

    @Test("truncate grows with zeros and shrinks, in packages and flat documents")
    func truncate() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let grow = try await sh(
                "truncate -s 100 Work.pkg/notes.txt && truncate -s 5 Flat.txt", in: mount.path)
            #expect(grow.status == 0, "\(grow.error)")
            let grown = Data(Fixture.notesText.utf8) + Data(count: 100 - Fixture.notesText.utf8.count)
            try await expectEventually("the grown file in the store") {
                try engine.contents("Work.pkg", "notes.txt") == grown && engine.text("Flat.txt") == "alpha"
            }
            #expect(try await shBytes("cat Work.pkg/notes.txt", in: mount.path) == grown)
            let shrink = try await sh(
                "truncate -s 3 Work.pkg/notes.txt && truncate -s 0 Flat.txt", in: mount.path)
            #expect(shrink.status == 0, "\(shrink.error)")
            try await expectEventually("the shrunk file in the store") {
                try engine.text("Work.pkg", "notes.txt") == "one" && engine.text("Flat.txt") == ""
            }
            #expect(
                try await sh("cat Work.pkg/notes.txt; stat -c %s Flat.txt", in: mount.path).output == "one0\n"
            )
        }
    }

    @Test("ln -s makes symbolic links; ln makes another name of a file")
    func links() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let soft = try await sh(
                "ln -s sub/inner.txt Work.pkg/inner-link && readlink Work.pkg/inner-link && cat Work.pkg/inner-link",
                in: mount.path)
            #expect(soft.status == 0, "\(soft.error)")
            #expect(soft.output == "sub/inner.txt\n" + Fixture.innerText)
            try await expectEventually("the link in the store") {
                let link = try engine.record("Work.pkg", "inner-link")
                return link?.kind == .symbolicLink && link?.linkTarget == "sub/inner.txt"
            }
            let hard = try await sh(
                "ln Work.pkg/notes.txt Work.pkg/hard && stat -c %h Work.pkg/hard", in: mount.path)
            #expect(hard.status == 0 && hard.output == "2\n", "\(hard.error)")
            try await expectEventually("the hard link in the store") {
                let notes = try engine.record("Work.pkg", "notes.txt")
                return try engine.record("Work.pkg", "hard")?.linkOf == notes?.id && notes != nil
            }
            #expect(try engine.text("Work.pkg", "hard") == Fixture.notesText)
        }
    }

    // MARK: rsync

    @Test(
        "rsync -a copies a tree into a package; a second run writes only the changed file",
        arguments: [false, true])
    func rsync(inPlace: Bool) async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let local = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: local) }
        // 384 KiB: two chunks, so rewriting it would show in the store's byte count.
        try await makeLocalTree(local, bigSize: 384 * 1024)
        let engine = try Engine(fixture)
        let flags = inPlace ? "-a --inplace" : "-a"
        try await withMount(fixture.store) { mount in
            let first = try await sh("rsync \(flags) \(local)/tree/ Work.pkg/tree/", in: mount.path)
            #expect(first.status == 0, "\(first.error)")
            let source = try await statLines(local + "/tree")
            #expect(try await statLines(mount.url("Work.pkg/tree")) == source)
            let big = try Data(contentsOf: URL(fileURLWithPath: local + "/tree/big.bin"))
            try await expectStoreMatches(local + "/tree", engine, "Work.pkg", at: "tree")
            #expect(try engine.contents("Work.pkg", "tree/big.bin") == big)
            let scratchInStore = try engine.scratchNamesInStore()
            #expect(scratchInStore == [])
            let before = try engine.tree("Work.pkg")

            // One file changes (size and time, so rsync's quick check sees it).
            let change = try await sh(
                "printf 'alpha, changed\\n' > tree/a.txt && touch -d '2010-01-01' tree/a.txt", in: local)
            #expect(change.status == 0)
            let written = fixture.store.statistics.bytesWritten
            let second = try await sh("rsync \(flags) \(local)/tree/ Work.pkg/tree/", in: mount.path)
            #expect(second.status == 0, "\(second.error)")
            try await expectStoreMatches(local + "/tree", engine, "Work.pkg", at: "tree")
            #expect(try engine.text("Work.pkg", "tree/a.txt") == "alpha, changed\n")
            let bytes = fixture.store.statistics.bytesWritten - written
            #expect(bytes < 64 * 1024, "the second run wrote \(bytes) bytes")
            // Every other regular file is the record it was (not rewritten).
            let after = try engine.tree("Work.pkg")
            for (path, record) in before where record.kind == .regularFile && path != "tree/a.txt" {
                #expect(after[path] == record, "\(path) was rewritten")
            }
            if inPlace {
                #expect(after["tree/a.txt"]?.id == before["tree/a.txt"]?.id)
            }
            #expect(try await statLines(mount.url("Work.pkg/tree")) == (try await statLines(local + "/tree")))
            // rsync's temporary .a.txt.XXXXXX is gone from the mount and from the store.
            #expect(try engine.paths("Work.pkg").filter { $0.contains("/.") } == [])
            #expect(
                try await offThread {
                    try entries(in: mount.url("Work.pkg/tree")).filter { $0.hasPrefix(".") }
                } == [])
        }
    }

    // MARK: tar

    @Test("tar extracts into a package and archives from the mount byte-identically")
    func tar() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let local = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: local) }
        try await makeLocalTree(local, bigSize: 300 * 1024)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            // POSIX format for the xattrs and nanosecond times; no atime/ctime and no PID in the
            // extended headers' names, so two archives of equal trees are equal bytes.
            let archive =
                "tar --sort=name --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime"
                + " --xattrs --xattrs-include='user.*'"
            let made = try await sh("\(archive) -cf \(local)/source.tar tree", in: local)
            #expect(made.status == 0, "\(made.error)")
            let extracted = try await sh(
                "tar --xattrs --xattrs-include='user.*' -xpf \(local)/source.tar -C Work.pkg", in: mount.path)
            #expect(extracted.status == 0, "\(extracted.error)")
            let fromMount = try await sh("\(archive) -cf \(local)/mount.tar -C Work.pkg tree", in: mount.path)
            #expect(fromMount.status == 0, "\(fromMount.error)")
            let a = try Data(contentsOf: URL(fileURLWithPath: local + "/source.tar"))
            let b = try Data(contentsOf: URL(fileURLWithPath: local + "/mount.tar"))
            #expect(a.count > 300 * 1024)
            #expect(a == b, "the archive made from the mount differs from the source's")
            // And back out: the same bytes as the source.
            let back = try await sh(
                "mkdir back && tar -xpf mount.tar -C back && diff -r tree back/tree && echo same", in: local)
            #expect(back.output == "same\n", "\(back.output) \(back.error)")
            let big = try Data(contentsOf: URL(fileURLWithPath: local + "/tree/big.bin"))
            try await expectStoreMatches(local + "/tree", engine, "Work.pkg", at: "tree")
            #expect(try engine.contents("Work.pkg", "tree/big.bin") == big)
            #expect(try engine.record("Work.pkg", "tree/run-link")?.linkTarget == "sub/run.sh")
        }
    }

    // MARK: xattrs

    @Test("setfattr stores user. attributes with the wrapper; trusted. is refused with ENOTSUP")
    func xattrs() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let set = try await sh(
                "setfattr -n user.k -v value Work.pkg/notes.txt && setfattr -x user.color Work.pkg/notes.txt"
                    + " && setfattr -n user.dir -v d Work.pkg/sub && setfattr -n user.flat -v f Flat.txt"
                    + " && setfattr -n user.package -v p Work.pkg && chmod 750 Work.pkg"
                    + " && getfattr -d Work.pkg/notes.txt Work.pkg/sub Flat.txt",
                in: mount.path)
            #expect(set.status == 0, "\(set.error)")
            #expect(
                set.output.contains("user.k=\"value\"") && !set.output.contains("user.color"), "\(set.output)"
            )
            try await expectEventually("the xattrs in the store") {
                try engine.record("Work.pkg", "notes.txt")?.extendedAttributes == [
                    "user.k": Data("value".utf8)
                ]
                    && engine.record("Work.pkg", "sub")?.extendedAttributes == ["user.dir": Data("d".utf8)]
                    && engine.record("Flat.txt")?.extendedAttributes == ["user.flat": Data("f".utf8)]
            }
            // The package's own directory: its root record.
            try await expectEventually("the package root's xattr and mode") {
                let root = try engine.record("Work.pkg")
                return root?.extendedAttributes == ["user.package": Data("p".utf8)]
                    && root?.permissions == 0o750
            }
            let trusted = try await sh("setfattr -n trusted.x -v 1 Work.pkg/notes.txt", in: mount.path)
            #expect(
                trusted.status != 0 && trusted.error.contains("Operation not supported"), "\(trusted.error)")
            let security = try await sh("setfattr -n security.x -v 1 Work.pkg/notes.txt", in: mount.path)
            #expect(security.status != 0, "\(security.error)")
            // Saved with the wrapper: contents untouched.
            #expect(try engine.text("Work.pkg", "notes.txt") == Fixture.notesText)
            #expect(
                try engine.record("Work.pkg", "notes.txt")?.extendedAttributes.keys.sorted() == ["user.k"])
        }
    }

    @Test("getfacl shows the mode as an ACL, setfacl is refused, ls -l marks no ACL and no label")
    func accessControlLists() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let get = try await sh(
                "chmod 640 Work.pkg/notes.txt && getfacl -c Work.pkg/notes.txt", in: mount.path)
            #expect(get.status == 0, "\(get.error)")
            #expect(get.output == "user::rw-\ngroup::r--\nother::---\n\n", "\(get.output)")
            let set = try await sh("setfacl -m u:nobody:r Work.pkg/notes.txt", in: mount.path)
            #expect(set.status != 0 && set.error.contains("Operation not supported"), "\(set.error)")
            let label = try await sh("getfattr -n security.selinux Work.pkg/notes.txt", in: mount.path)
            #expect(label.status != 0 && label.error.contains("Operation not supported"), "\(label.error)")
            // No "+" (an ACL) or "." (a security label) after the mode.
            let list = try await sh("ls -l Work.pkg/notes.txt", in: mount.path)
            #expect(list.output.hasPrefix("-rw-r----- "), "\(list.output)")
            // The mode still decides, after a chmod as before it (default_permissions).
            let reread = try await sh(
                "chmod 600 Work.pkg/notes.txt && getfacl -c Work.pkg/notes.txt", in: mount.path)
            #expect(reread.output == "user::rw-\ngroup::---\nother::---\n\n", "\(reread.output)")
        }
    }

    // MARK: gio

    @Test("gio list, info, copy, move and remove work on the mount")
    func gio() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let env = "export GIO_USE_VFS=local; "
            let list = try await sh(env + "gio list -l Work.pkg", in: mount.path)
            #expect(list.status == 0, "\(list.error)")
            #expect(list.output.contains("notes.txt\t14\t(regular)"), "\(list.output)")
            #expect(list.output.contains("sub\t"), "\(list.output)")
            let info = try await sh(env + "gio info Work.pkg/notes.txt", in: mount.path)
            #expect(info.status == 0 && info.output.contains("size:  14"), "\(info.output) \(info.error)")
            let changes = try await sh(
                env
                    + "gio copy Work.pkg/notes.txt Work.pkg/copy.txt && gio move Work.pkg/copy.txt Work.pkg/sub/moved.txt"
                    + " && gio remove Work.pkg/sub/inner.txt && gio copy Flat.txt Other.pkg/flat-copy.txt",
                in: mount.path)
            #expect(changes.status == 0, "\(changes.error)")
            try await expectEventually("gio's changes in the store") {
                try engine.paths("Work.pkg") == ["link", "notes.txt", "sub", "sub/moved.txt"]
                    && engine.text("Other.pkg", "flat-copy.txt") == Fixture.flatText
            }
            #expect(try engine.text("Work.pkg", "sub/moved.txt") == Fixture.notesText)
            let scratchInStore = try engine.scratchNamesInStore()
            #expect(scratchInStore == [])
        }
    }
}
