import DocumentEngine
import DocumentFS
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// Where an editor saves: a wrapper inside a package, or a flat document at the mount root.
enum EditTarget: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case wrapper, flat

    var testDescription: String { self == .wrapper ? "Work.pkg/notes.txt" : "Flat.txt at the root" }
    /// The store document edited.
    var document: String { self == .wrapper ? "Work.pkg" : "Flat.txt" }
    /// The directory the editor runs in, relative to the mount ("" is the root).
    var directory: String { self == .wrapper ? "Work.pkg" : "" }
    /// The file name the editor is given.
    var file: String { self == .wrapper ? "notes.txt" : "Flat.txt" }
    /// The wrapper's path inside the document ("" is a flat document's root).
    var path: String { self == .wrapper ? "notes.txt" : "" }
    var original: String { self == .wrapper ? Fixture.notesText : Fixture.flatText }
    var mode: Int { self == .wrapper ? 0o640 : 0o644 }

    /// Every line of the original with "!" appended (what `s/$/!/` makes of it).
    var banged: String { original.split(separator: "\n").map { $0 + "!\n" }.joined() }

    func directory(in mount: TestMount) -> String { directory.isEmpty ? mount.path : mount.url(directory) }
    func filePath(in mount: TestMount) -> String { directory(in: mount) + "/" + file }
}

/// What the store and the mount looked like before an edit.
struct BeforeEdit {
    var document: DocumentInfo
    var versionCount: Int
    var record: NodeRecord
    var inode: UInt64
    var documentNames: [String]
    var paths: [String]
    /// The entries of the directory the editor runs in.
    var entries: [String]

    init(_ engine: Engine, _ target: EditTarget, _ mount: TestMount) throws {
        document = try engine.document(target.document)
        versionCount = try engine.versions(target.document).count
        guard let record = try engine.record(target.document, target.path) else { throw TestFailure("no record") }
        self.record = record
        inode = UInt64(try statOf(target.filePath(in: mount)).st_ino)
        documentNames = try engine.documentNames()
        paths = target == .wrapper ? try engine.paths(target.document) : []
        entries = try DocumentFSTests.entries(in: target.directory(in: mount))
    }
}

/// How a save is expected to look.
struct SaveExpectation {
    var contents: String
    /// Scratch files the tool keeps on purpose (nano --backup, emacs and `sed -i~` backups): name
    /// → contents. They stay in the mount as real files but never reach the store.
    var backups: [String: String] = [:]
    /// true: saved in place (same inode); false: a new file replaced the old one (vim's rename
    /// mode); nil: either.
    var sameInode: Bool? = nil
    /// Exactly one new store version (a scratch file renamed onto the wrapper is one save).
    var oneVersion = false
}

/// Real editors and in-place tools save through the mount (docs/design/fuse-notes.md §3.1–§3.4):
/// each run ends with the new contents as a new version of the same document in the store (checked through a
/// second store connection), no scratch name anywhere in the store (all versions), and no
/// leftover scratch file in the mount. Every edit runs once on a wrapper in a package and once on
/// a flat document at the mount root.
@Suite(.serialized)
struct EditorSaveTests {
    /// Mounts a small store, snapshots it, runs `edit` in the target's directory, checks the result.
    func edit(
        _ target: EditTarget, _ expectation: (BeforeEdit) -> SaveExpectation,
        sourceLocation: SourceLocation = #_sourceLocation,
        _ edit: (TestMount, String) async throws -> Void
    ) async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let before = try await offThread { try BeforeEdit(engine, target, mount) }
            try await edit(mount, target.directory(in: mount))
            try await expectSaved(engine, target, mount, before, expectation(before), sourceLocation: sourceLocation)
        }
    }

    func expectSaved(
        _ engine: Engine, _ target: EditTarget, _ mount: TestMount, _ before: BeforeEdit,
        _ expected: SaveExpectation, sourceLocation: SourceLocation
    ) async throws {
        // Close, fsync and rename-onto are save points that finish before the editor's call
        // returns; a later metadata change (vim's fchmod after fsync) may wait for the quiet
        // interval, hence the short poll.
        let saved = try await waitUntil(timeout: 3) {
            try engine.text(target.document, target.path) == expected.contents
                && engine.record(target.document, target.path)?.permissions == target.mode
        }
        let stored = try engine.text(target.document, target.path)
        #expect(
            saved != nil, "the store has \(String(describing: stored)), not \(expected.contents.debugDescription)",
            sourceLocation: sourceLocation)
        let path = target.filePath(in: mount)
        let directory = target.directory(in: mount)
        let shown = try await offThread { try readText(path) }
        #expect(shown == expected.contents, "the mount shows \(shown.debugDescription)", sourceLocation: sourceLocation)

        // The same document, one or more versions newer, with its mode.
        let document = try engine.document(target.document)
        #expect(document.id == before.document.id, "the document lost its identity", sourceLocation: sourceLocation)
        let versions = try engine.versions(target.document)
        if expected.oneVersion {
            #expect(
                versions.count == before.versionCount + 1, "\(versions.count - before.versionCount) new versions",
                sourceLocation: sourceLocation)
        } else {
            #expect(versions.count > before.versionCount, "no new version", sourceLocation: sourceLocation)
        }
        let record = try #require(try engine.record(target.document, target.path), sourceLocation: sourceLocation)
        #expect(record.kind == .regularFile, sourceLocation: sourceLocation)
        #expect(
            record.permissions == target.mode, "mode \(String(record.permissions, radix: 8))",
            sourceLocation: sourceLocation)
        #expect(record.size == Int64(expected.contents.utf8.count), sourceLocation: sourceLocation)

        // No scratch name in any version of any document, nor as a document.
        let scratchInStore = try engine.scratchNamesInStore()
        #expect(scratchInStore == [], sourceLocation: sourceLocation)
        #expect(try engine.documentNames() == before.documentNames, sourceLocation: sourceLocation)
        if target == .wrapper {
            #expect(try engine.paths(target.document) == before.paths, sourceLocation: sourceLocation)
        }

        // The mount: the directory as before plus the backups kept on purpose, nothing else.
        let backups = expected.backups
        let (entries, backupContents, st) = try await offThread {
            () -> ([String], [String: String], stat) in
            let entries = try DocumentFSTests.entries(in: directory)
            var contents: [String: String] = [:]
            for name in backups.keys { contents[name] = try readText(directory + "/" + name) }
            return (entries, contents, try statOf(path))
        }
        #expect(
            entries == (before.entries + backups.keys).sorted(), "leftovers in the mount: \(entries)",
            sourceLocation: sourceLocation)
        #expect(backupContents == backups, sourceLocation: sourceLocation)
        if target == .wrapper {
            let scratch = try await offThread { scratchFiles(under: directory) }
            #expect(scratch == backups.keys.sorted(), "scratch files: \(scratch)", sourceLocation: sourceLocation)
        }
        // inode = store node id + 1; vim's rename mode makes a new file, in-place saves keep it.
        #expect(
            UInt64(st.st_ino) == UInt64(record.id.rawValue) + 1, "inode \(st.st_ino) for \(record.id)",
            sourceLocation: sourceLocation)
        #expect(st.st_size == expected.contents.utf8.count, sourceLocation: sourceLocation)
        #expect(Int(st.st_mode & 0o7777) == target.mode, sourceLocation: sourceLocation)
        if let same = expected.sameInode {
            if same {
                #expect(UInt64(st.st_ino) == before.inode, "the inode changed", sourceLocation: sourceLocation)
                #expect(record.id == before.record.id, "the wrapper's node changed", sourceLocation: sourceLocation)
            } else {
                #expect(UInt64(st.st_ino) != before.inode, "vim did not use rename mode", sourceLocation: sourceLocation)
            }
        }
        // A flat document keeps its identity: the same root node, so the same inode.
        if target == .flat {
            #expect(record.id == before.record.id, "the document's root node changed", sourceLocation: sourceLocation)
        }
    }

    // MARK: Scratch names (docs/design/fuse-notes.md §3.4)

    /// One name of each scratch pattern (and vim's probe numbers), made by hand.
    static let scratchSamples = [
        ".notes.txt.swp", ".notes.txt.swo", ".notes.txt.swx", ".notes.txt.swz", "notes.txt~", "#notes.txt#",
        ".goutputstream-AB12cd", "sedAb12Cd", ".~lock.notes.txt#", "lu4321.tmp", ".notes.txt.kate-swp",
        "notes.txt.kate-swp", "4913", "5036", "5159",
    ]

    @Test("scratch files of every pattern are real files in a package and at the root, but never reach the store", arguments: EditTarget.allCases)
    func scratchFilesStayOutOfTheStore(_ target: EditTarget) async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let engine = try Engine(fixture)
        let versions = try engine.store.documents().map { try engine.store.versions(of: $0.id).count }
        let samples = Self.scratchSamples
        try await withMount(fixture.store) { mount in
            let directory = target.directory(in: mount)
            let listed = try await offThread { () -> [String] in
                for name in samples {
                    let fd = try openFile(directory + "/" + name, O_RDWR | O_CREAT | O_EXCL, 0o600)
                    try writeAll(fd, "scratch \(name)\n")
                    try sys(fsync(fd), "fsync \(name)")
                    try sys(close(fd), "close \(name)")
                }
                // emacs's lock is a symbolic link.
                try sys(symlink("root@host.1:2", directory + "/.#notes.txt"), "symlink")
                return try entries(in: directory)
            }
            #expect(Set(samples + [".#notes.txt"]).isSubset(of: Set(listed)), "\(listed)")
            // Past a quiet interval: nothing was saved at all (an app would reload on a new
            // version).
            _ = try await offThread { usleep(useconds_t((quietInterval + 0.5) * 1_000_000)) }
            let scratchInStore = try engine.scratchNamesInStore()
            #expect(scratchInStore == [])
            #expect(try engine.store.documents().map { try engine.store.versions(of: $0.id).count } == versions)
            let (texts, link) = try await offThread { () -> ([String], String) in
                let texts = try samples.map { try readText(directory + "/" + $0) }
                let link = try FileManager.default.destinationOfSymbolicLink(atPath: directory + "/.#notes.txt")
                return (texts, link)
            }
            #expect(texts == samples.map { "scratch \($0)\n" })
            #expect(link == "root@host.1:2")
            // Renamed onto the wrapper, a scratch file is published in one save.
            let before = try engine.versions(target.document).count
            try await offThread {
                try sys(rename(directory + "/.goutputstream-AB12cd", target.filePath(in: mount)), "rename")
            }
            // The rename returns before its save, which the committer makes.
            try await expectEventually("the published scratch file saved") {
                try engine.text(target.document, target.path) == "scratch .goutputstream-AB12cd\n"
            }
            #expect(try engine.versions(target.document).count == before + 1)
        }
        // Never saved: gone after a remount.
        try await withMount(try fixture.reopen()) { mount in
            let listed = try await offThread { try entries(in: target.directory(in: mount)) }
            #expect(listed.filter(isScratchName) == [], "\(listed)")
        }
    }

    // MARK: vim (docs/design/fuse-notes.md §3.1)

    /// vim non-interactively, with a swap file in the same directory (`directory=.`, not `-n`),
    /// `backupskip=` (its default skips /tmp/*, where the mounts are), and a listing of the
    /// directory taken while vim runs, to prove the swap file was made on the mount.
    func vim(_ settings: String, _ file: String, in directory: String, pause: Bool = false) async throws -> [String] {
        let outside = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: outside) }
        let listing = outside + "/listing"
        // `preserve` writes the swap file (random 4 KiB writes, fsync); the pause lets a quiet
        // interval pass with the swap file dirty.
        let script = """
            TERM=dumb vim -N -u NONE -i NONE -es -c 'set swapfile directory=. backupskip= \(settings)' \
              -c '%s/$/!/' -c 'preserve' \(pause ? "-c 'sleep 1200m'" : "") \
              -c "call writefile(readdir('.'), '\(listing)')" -c 'wq' \(quoted(file)) </dev/null
            """
        let result = try await sh(script, in: directory)
        #expect(result.status == 0, "vim: \(result.status) \(result.output) \(result.error)")
        #expect(!result.error.contains("E667") && !result.error.contains("E512"), "\(result.error)")
        let seen = (try? String(contentsOfFile: listing, encoding: .utf8)) ?? ""
        return seen.split(separator: "\n").map(String.init)
    }

    @Test("vim's default save: swap file, 4913 probe, rename to name~, new file, fsync", arguments: EditTarget.allCases)
    func vimDefault(_ target: EditTarget) async throws {
        // In a package vim's rename mode makes a new file, a new wrapper; a flat document keeps
        // its identity, so its inode (root node id + 1) stays.
        let sameInode = target == .wrapper ? false : true
        try await edit(target, { _ in SaveExpectation(contents: target.banged, sameInode: sameInode) }) {
            mount, directory in
            let seen = try await vim("", target.file, in: directory, pause: true)
            #expect(seen.contains(".\(target.file).swp"), "no swap file while vim ran: \(seen)")
        }
    }

    @Test("vim backupcopy=yes: copy to name~, then truncate and rewrite in place", arguments: EditTarget.allCases)
    func vimBackupCopy(_ target: EditTarget) async throws {
        try await edit(target, { _ in SaveExpectation(contents: target.banged, sameInode: true) }) {
            mount, directory in
            let seen = try await vim("backupcopy=yes", target.file, in: directory)
            #expect(seen.contains(".\(target.file).swp"), "no swap file while vim ran: \(seen)")
        }
    }

    // MARK: nano (docs/design/fuse-notes.md §3.2)

    /// nano on a pseudo-terminal (`script`), fed keys once its lock file (`--locking`, a
    /// vim-style `.name.swp`) shows it is up: "HELLO " ^O Enter, a pause longer than the quiet
    /// interval, "AGAIN " ^O Enter, ^X. Had a background save changed the file's mtime or inode,
    /// the second ^O would stop at "File on disk has changed" and AGAIN would never be saved.
    func nano(_ options: String, _ file: String, in directory: String, pause: Bool) async throws {
        let lock = ".\(file).swp"
        let keys = """
            n=0; until [ -e \(quoted(lock)) ]; do sleep 0.05; n=$((n+1)); [ $n -gt 100 ] && break; done
            sleep 0.3; printf 'HELLO '; sleep 0.1; printf '\\017'; sleep 0.3; printf '\\r'; sleep \(pause ? "1.3" : "0.3")
            printf 'AGAIN '; sleep 0.1; printf '\\017'; sleep 0.3; printf '\\r'; sleep 0.3
            printf '\\030'
            n=0; while [ -e \(quoted(lock)) ]; do sleep 0.05; n=$((n+1)); [ $n -gt 100 ] && break; done
            exit 0
            """
        let script = """
            ( \(keys) ) | TERM=xterm script -qfec "nano -I --locking \(options) \(quoted(file))" /dev/null >/dev/null
            """
        // A nano that never gets its ^X (a failed save keeps it at a prompt) ends after 20 s.
        let result = try await sh(script, in: directory, seconds: 20)
        #expect(result.status == 0, "nano: \(result.status) \(result.error)")
    }

    @Test("nano: in-place O_TRUNC write, fsync, close; twice, with a quiet interval between", arguments: EditTarget.allCases)
    func nanoSave(_ target: EditTarget) async throws {
        try await edit(target, { _ in SaveExpectation(contents: "HELLO AGAIN " + target.original, sameInode: true) }) {
            mount, directory in
            try await nano("", target.file, in: directory, pause: true)
        }
    }

    @Test("nano --backup keeps name~ in the mount, never in the store", arguments: EditTarget.allCases)
    func nanoBackup(_ target: EditTarget) async throws {
        // nano backs up the file as it is on disk before each save.
        try await edit(target, { _ in
            SaveExpectation(
                contents: "HELLO AGAIN " + target.original,
                backups: [target.file + "~": "HELLO " + target.original], sameInode: true)
        }) { mount, directory in
            try await nano("--backup", target.file, in: directory, pause: false)
        }
    }

    // MARK: emacs (docs/design/fuse-notes.md §3.3)

    @Test("emacs: lock symlink .#name while modified, auto-save #name#, backup by rename to name~", arguments: EditTarget.allCases)
    func emacsSave(_ target: EditTarget) async throws {
        try await edit(target, { _ in
            SaveExpectation(contents: target.original + "added\n", backups: [target.file + "~": target.original])
        }) { mount, directory in
            let file = target.file
            // Batch mode locks, but turns auto-save off and skips backups under /tmp (where the
            // mounts are): turn both on.
            let lisp = """
                (progn
                  (setq make-backup-files t backup-enable-predicate (lambda (_) t) print-escape-newlines t)
                  (find-file "\(file)")
                  (auto-save-mode 1)
                  (goto-char (point-max))
                  (insert "added\\n")
                  (princ (format "lock=%S\\n" (file-symlink-p ".#\(file)")))
                  (do-auto-save t)
                  (princ (format "autosave=%S\\n" (with-temp-buffer (insert-file-contents "#\(file)#") (buffer-string))))
                  (save-buffer)
                  (princ (format "after=%S %S\\n" (file-symlink-p ".#\(file)") (file-exists-p "#\(file)#"))))
                """
            let result = try await sh("emacs -Q --batch --eval \(quoted(lisp)) </dev/null", in: directory)
            #expect(result.status == 0, "emacs: \(result.error)")
            let lines = result.output.split(separator: "\n").map(String.init)
            #expect(lines.count == 3, "\(result.output) \(result.error)")
            // The lock is a symbolic link to "user@host.pid".
            #expect(lines.first?.hasPrefix("lock=\"") == true && lines.first?.contains("@") == true, "\(lines)")
            #expect(lines.dropFirst().first == "autosave=\((target.original + "added\n").debugDescription)", "\(lines)")
            #expect(lines.last == "after=nil nil", "\(lines)")
        }
    }

    // MARK: sed -i, perl -pi (docs/design/fuse-notes.md §3.4)

    @Test("sed -i: sedXXXXXX in the same directory renamed onto the file, one save", arguments: EditTarget.allCases)
    func sedInPlace(_ target: EditTarget) async throws {
        try await edit(target, { _ in SaveExpectation(contents: target.banged, oneVersion: true) }) {
            mount, directory in
            let result = try await sh("sed -i 's/$/!/' \(quoted(target.file))", in: directory)
            #expect(result.status == 0, "sed: \(result.error)")
        }
    }

    @Test("sed -i~: the original renamed to name~, then sedXXXXXX renamed onto the name", arguments: EditTarget.allCases)
    func sedWithBackup(_ target: EditTarget) async throws {
        try await edit(target, { _ in
            SaveExpectation(contents: target.banged, backups: [target.file + "~": target.original])
        }) { mount, directory in
            let result = try await sh("sed -i~ 's/$/!/' \(quoted(target.file))", in: directory)
            #expect(result.status == 0, "sed: \(result.error)")
        }
    }

    @Test("perl -pi: a temporary XX?????? file, closed, then renamed onto the file", arguments: EditTarget.allCases)
    func perlInPlace(_ target: EditTarget) async throws {
        try await edit(target, { _ in SaveExpectation(contents: target.banged) }) { mount, directory in
            let result = try await sh("perl -pi -e 's/$/!/' \(quoted(target.file))", in: directory)
            #expect(result.status == 0, "perl: \(result.error)")
        }
    }

    // MARK: GIO (docs/design/fuse-notes.md §3.4)

    @Test("gio save (g_file_replace): .goutputstream-XXXXXX, fsync, rename onto the file, one save", arguments: EditTarget.allCases)
    func gioSave(_ target: EditTarget) async throws {
        try await edit(target, { _ in SaveExpectation(contents: "saved by gio\n", oneVersion: true) }) {
            mount, directory in
            let result = try await sh(
                "printf 'saved by gio\\n' | GIO_USE_VFS=local gio save \(quoted(target.file))", in: directory)
            #expect(result.status == 0, "gio: \(result.error)")
        }
    }
}
