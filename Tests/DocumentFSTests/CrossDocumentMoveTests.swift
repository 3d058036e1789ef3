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

/// The mount root is a full directory: a rename that moves a file or folder
/// between documents, or between a package and the root, is one store transaction that gives
/// both documents a new version; rename(2) does not answer EXDEV.
@Suite(.serialized)
struct CrossDocumentMoveTests {
    func text(_ path: String) async throws -> String {
        try await offThread { try String(contentsOfFile: path, encoding: .utf8) }
    }

    @Test(
        "a file and a folder move from one package into another: one new version each, same inode, contents shared",
        arguments: StoreKind.all)
    func packageToPackage(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let workVersions = try engine.versions("Work.pkg").count
        let otherVersions = try engine.versions("Other.pkg").count
        let written = fixture.store.statistics.bytesWritten
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let before = try await offThread { try statOf(p + "/Work.pkg/notes.txt") }
            try await offThread {
                try sys(rename(p + "/Work.pkg/notes.txt", p + "/Other.pkg/notes.txt"), "move a file")
                try sys(rename(p + "/Work.pkg/sub", p + "/Other.pkg/folder"), "move a folder")
            }
            let after = try await offThread { try statOf(p + "/Other.pkg/notes.txt") }
            #expect(after.st_ino == before.st_ino)
            #expect(after.st_mode & 0o7777 == 0o640)
            #expect(try await text(p + "/Other.pkg/notes.txt") == Fixture.notesText)
            #expect(try await text(p + "/Other.pkg/folder/inner.txt") == Fixture.innerText)
            #expect(try await offThread { access(p + "/Work.pkg/notes.txt", F_OK) } == -1)
            #expect(try await offThread { try entries(in: p + "/Work.pkg") } == ["link"])
            // The user's extended attribute went along.
            let color = try await offThread { () -> String in
                var buffer = [UInt8](repeating: 0, count: 16)
                let count = getxattr(p + "/Other.pkg/notes.txt", "user.color", &buffer, 16)
                return count > 0 ? String(decoding: buffer[0..<count], as: UTF8.self) : ""
            }
            #expect(color == "blue")
        }
        #expect(try engine.paths("Work.pkg") == ["link"])
        #expect(try engine.paths("Other.pkg") == ["folder", "folder/inner.txt", "notes.txt", "other.txt"])
        #expect(try engine.text("Other.pkg", "notes.txt") == Fixture.notesText)
        #expect(try engine.text("Other.pkg", "folder/inner.txt") == Fixture.innerText)
        #expect(
            try engine.record("Other.pkg", "notes.txt")?.extendedAttributes["user.color"] == Data("blue".utf8)
        )
        // Two moves, each one new version of each document; no content bytes written.
        #expect(try engine.versions("Work.pkg").count == workVersions + 2)
        #expect(try engine.versions("Other.pkg").count == otherVersions + 2)
        #expect(fixture.store.statistics.bytesWritten == written)
        #expect(try engine.store.checkIntegrity().isClean)

        // A new mount shows the same.
        try await withMount(fixture.store) { mount in
            let inner = try await text(mount.path + "/Other.pkg/folder/inner.txt")
            #expect(inner == Fixture.innerText)
        }
    }

    @Test(
        "a document moves into a package and a wrapper out to the root; a move replaces what has its name",
        arguments: StoreKind.all)
    func rootAndPackages(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let flat = try engine.document("Flat.txt")
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let (flatIno, subIno) = try await offThread {
                (try statOf(p + "/Flat.txt").st_ino, try statOf(p + "/Work.pkg/sub").st_ino)
            }
            try await offThread {
                try sys(rename(p + "/Flat.txt", p + "/Work.pkg/Flat.txt"), "a document into a package")
                try sys(rename(p + "/Work.pkg/sub", p + "/Sub.pkg"), "a folder to the root")
                try sys(rename(p + "/Work.pkg/notes.txt", p + "/Notes.txt"), "a file to the root")
                // Over an existing wrapper, and over an existing document.
                try sys(rename(p + "/Notes.txt", p + "/Other.pkg/other.txt"), "over a wrapper")
                try sys(rename(p + "/Sub.pkg/inner.txt", p + "/Work.pkg/Flat.txt"), "over a moved file")
            }
            #expect(try await offThread { try statOf(p + "/Work.pkg/Flat.txt").st_ino } != flatIno)
            #expect(try await offThread { try statOf(p + "/Sub.pkg").st_ino } == subIno)
            #expect(try await offThread { try entries(in: p) } == ["Other.pkg", "Sub.pkg", "Work.pkg"])
            #expect(try await text(p + "/Other.pkg/other.txt") == Fixture.notesText)
            #expect(try await text(p + "/Work.pkg/Flat.txt") == Fixture.innerText)
            #expect(try await offThread { try entries(in: p + "/Sub.pkg") } == [])
        }
        #expect(try engine.documentNames() == ["Other.pkg", "Sub.pkg", "Work.pkg"])
        #expect(try engine.paths("Work.pkg") == ["Flat.txt", "link"])
        #expect(try engine.text("Work.pkg", "Flat.txt") == Fixture.innerText)
        #expect(try engine.text("Other.pkg", "other.txt") == Fixture.notesText)
        #expect(try engine.paths("Sub.pkg") == [])
        // The document that moved into a package is deleted, and can be restored.
        #expect(try engine.store.deletedDocuments().contains { $0.id == flat.id })
        #expect(try engine.store.checkIntegrity().isClean)
    }

    @Test(
        "unsaved writes move with the file; a moved name of a linked file becomes a file of its own",
        arguments: StoreKind.all)
    func unsavedAndLinks(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(
            fixture.store, configure: { $0.fileSystem.quietInterval = .seconds(3600) }
        ) { mount in
            let p = mount.path
            try await offThread {
                // Written and closed without fsync, then moved at once.
                try Data("fresh\n".utf8).write(to: URL(fileURLWithPath: p + "/Work.pkg/fresh.txt"))
                try sys(rename(p + "/Work.pkg/fresh.txt", p + "/Other.pkg/fresh.txt"))
                try sys(link(p + "/Work.pkg/notes.txt", p + "/Work.pkg/notes-2.txt"))
                try sys(rename(p + "/Work.pkg/notes-2.txt", p + "/Other.pkg/notes-2.txt"))
            }
            #expect(try await text(p + "/Other.pkg/fresh.txt") == "fresh\n")
            // The kernel counted the link itself; with its writeback cache it takes the new counts
            // from the mount's invalidation, a moment after the rename returns.
            let split = try await waitUntil(timeout: 3) {
                let (left, moved) = (
                    try statOf(p + "/Work.pkg/notes.txt"), try statOf(p + "/Other.pkg/notes-2.txt")
                )
                return left.st_nlink == 1 && moved.st_nlink == 1
            }
            #expect(split != nil, "the names still count each other as links")
            #expect(try await text(p + "/Other.pkg/notes-2.txt") == Fixture.notesText)
        }
        #expect(try engine.text("Other.pkg", "fresh.txt") == "fresh\n")
        #expect(try engine.record("Work.pkg", "fresh.txt") == nil)
        #expect(try engine.record("Other.pkg", "notes-2.txt")?.linkOf == nil)
        #expect(try engine.text("Other.pkg", "notes-2.txt") == Fixture.notesText)
        #expect(try engine.store.checkIntegrity().isClean)
    }

    @Test(
        "renameat2 RENAME_EXCHANGE across documents and with the root: both move, one transaction, inodes kept",
        arguments: StoreKind.all)
    func exchange(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let workVersions = try engine.versions("Work.pkg").count
        try await withMount(fixture.store) { mount in
            let p = mount.path
            let (notes, other) = try await offThread {
                (try statOf(p + "/Work.pkg/notes.txt").st_ino, try statOf(p + "/Other.pkg/other.txt").st_ino)
            }
            let results = try await offThread {
                [
                    // Two files in two packages.
                    errnoOf(
                        docfs_renameat2(
                            AT_FDCWD, p + "/Work.pkg/notes.txt", AT_FDCWD, p + "/Other.pkg/other.txt",
                            renameExchange)),
                    // A folder and a file.
                    errnoOf(
                        docfs_renameat2(
                            AT_FDCWD, p + "/Work.pkg/sub", AT_FDCWD, p + "/Other.pkg/other.txt",
                            renameExchange)),
                    // A document at the root and a file in a package.
                    errnoOf(
                        docfs_renameat2(
                            AT_FDCWD, p + "/Flat.txt", AT_FDCWD, p + "/Work.pkg/notes.txt", renameExchange)),
                ]
            }
            #expect(results == [0, 0, 0])
            // notes.txt's file is at Work.pkg/sub now, and other.txt's at the root as Flat.txt.
            #expect(try await offThread { try statOf(p + "/Work.pkg/sub").st_ino } == notes)
            #expect(try await offThread { try statOf(p + "/Flat.txt").st_ino } == other)
            #expect(try await text(p + "/Work.pkg/sub") == Fixture.notesText)
            #expect(try await text(p + "/Flat.txt") == Fixture.otherText)
            #expect(try await text(p + "/Work.pkg/notes.txt") == Fixture.flatText)
            #expect(try await text(p + "/Other.pkg/other.txt/inner.txt") == Fixture.innerText)
        }
        #expect(try engine.paths("Work.pkg") == ["link", "notes.txt", "sub"])
        #expect(try engine.paths("Other.pkg") == ["other.txt", "other.txt/inner.txt"])
        #expect(try engine.text("Work.pkg", "sub") == Fixture.notesText)
        #expect(try engine.text("Work.pkg", "notes.txt") == Fixture.flatText)
        #expect(try engine.text("Flat.txt") == Fixture.otherText)
        // Three exchanges, one new version of Work.pkg each.
        #expect(try engine.versions("Work.pkg").count == workVersions + 3)
        #expect(try engine.store.checkIntegrity().isClean)
    }

    @Test("mv moves between documents without copying", arguments: StoreKind.all)
    func mv(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            // A copy would make new inodes; a move keeps them.
            let result = try await sh(
                "a=$(stat -c %i Work.pkg/sub/inner.txt) && mv Work.pkg/sub Other.pkg/ && b=$(stat -c %i Other.pkg/sub/inner.txt) && test \"$a\" = \"$b\" && echo same",
                in: mount.path)
            #expect(result.output == "same\n", "\(result.error)")
        }
        #expect(try engine.paths("Other.pkg") == ["other.txt", "sub", "sub/inner.txt"])
    }
}
