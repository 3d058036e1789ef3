import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Hard links inside a document: one inode under several names, stored once.
@Suite(.serialized)
struct HardLinkTests {
    @Test(
        "link(2) in a package: nlink, one inode, writes through either name, rename between names, unlink keeps the rest, kept by the store",
        arguments: StoreKind.all)
    func hardLinks(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let notesID = try #require(try engine.record("Work.pkg", "notes.txt")?.id)
        try await withMount(fixture.store) { mount in
            let p = mount.path + "/Work.pkg"
            try await offThread {
                try sys(link(p + "/notes.txt", p + "/sub/notes-link"), "link")
                try sys(link(p + "/sub/notes-link", p + "/third.txt"), "link of a link")
            }
            let (a, b, c) = try await offThread {
                try (statOf(p + "/notes.txt"), statOf(p + "/sub/notes-link"), statOf(p + "/third.txt"))
            }
            #expect(a.st_ino == b.st_ino && b.st_ino == c.st_ino)
            #expect(a.st_nlink == 3 && b.st_nlink == 3)
            #expect(b.st_mode & 0o7777 == 0o640)

            // A write through one name shows through the others, open or not.
            try await offThread {
                let fd = try sys(open(p + "/sub/notes-link", O_WRONLY | O_APPEND), "open")
                defer { close(fd) }
                _ = try sys(write(fd, "appended\n", 9))
                try sys(fsync(fd))
            }
            let expected = Fixture.notesText + "appended\n"
            #expect(
                try await offThread { try String(contentsOfFile: p + "/notes.txt", encoding: .utf8) }
                    == expected)
            #expect(
                try await offThread { try String(contentsOfFile: p + "/third.txt", encoding: .utf8) }
                    == expected)

            // rename(2) between two names of one file does nothing (POSIX).
            try await offThread { try sys(rename(p + "/notes.txt", p + "/third.txt")) }
            #expect(try await offThread { access(p + "/notes.txt", F_OK) } == 0)
            #expect(try await offThread { try statOf(p + "/third.txt").st_nlink } == 3)

            // Across documents, into the root, and of a folder, as between file systems.
            let refused = try await offThread {
                (
                    errnoOf(link(p + "/notes.txt", mount.path + "/Other.pkg/notes.txt")),
                    errnoOf(link(p + "/notes.txt", mount.path + "/Notes")),
                    errnoOf(link(mount.path + "/Flat.txt", p + "/flat.txt")),
                    errnoOf(link(p + "/sub", p + "/sub2")),
                    errnoOf(link(p + "/notes.txt", p + "/link"))
                )
            }
            #expect(refused == (EXDEV, EXDEV, EXDEV, EPERM, EEXIST))
        }

        // The store keeps one file and two names that name it; the bytes once.
        let tree = try engine.tree("Work.pkg")
        let linkRecord = try #require(tree["sub/notes-link"])
        #expect(linkRecord.linkOf == notesID)
        #expect(tree["third.txt"]?.linkOf == notesID)
        #expect(tree["notes.txt"]?.linkOf == nil)
        #expect(linkRecord.size == Int64(Fixture.notesText.utf8.count + 9))
        #expect(try engine.text("Work.pkg", "sub/notes-link") == Fixture.notesText + "appended\n")
        #expect(try engine.store.checkIntegrity().isClean)

        try await withMount(fixture.store) { mount in
            let p = mount.path + "/Work.pkg"
            // A new mount shows them as they were: one inode, three names.
            let (a, b) = try await offThread { try (statOf(p + "/notes.txt"), statOf(p + "/sub/notes-link")) }
            #expect(a.st_ino == b.st_ino && a.st_nlink == 3)
            // Removing the file's first name keeps the file, its inode and contents under the others.
            try await offThread { try sys(unlink(p + "/notes.txt")) }
            let after = try await offThread { try statOf(p + "/sub/notes-link") }
            #expect(after.st_ino == a.st_ino && after.st_nlink == 2)
            #expect(
                try await offThread { try String(contentsOfFile: p + "/sub/notes-link", encoding: .utf8) }
                    == Fixture.notesText + "appended\n")
            // A safe save (a new file renamed over one name) leaves the other name the old file.
            try await offThread {
                try Data("new\n".utf8).write(to: URL(fileURLWithPath: p + "/.third.txt.tmp"))
                try sys(rename(p + "/.third.txt.tmp", p + "/third.txt"))
            }
            #expect(try await offThread { try statOf(p + "/sub/notes-link").st_nlink } == 1)
            #expect(try await offThread { try statOf(p + "/third.txt").st_nlink } == 1)
            #expect(
                try await offThread { try String(contentsOfFile: p + "/third.txt", encoding: .utf8) }
                    == "new\n")
            #expect(
                try await offThread { try String(contentsOfFile: p + "/sub/notes-link", encoding: .utf8) }
                    == Fixture.notesText + "appended\n")
        }
        let final = try engine.tree("Work.pkg")
        #expect(final["notes.txt"] == nil)
        #expect(final["sub/notes-link"]?.id == notesID)
        #expect(final["sub/notes-link"]?.linkOf == nil)
        #expect(final["third.txt"]?.linkOf == nil)
        #expect(try engine.text("Work.pkg", "third.txt") == "new\n")
        #expect(try engine.store.checkIntegrity().isClean)
    }

    @Test(
        "a file with other names renamed to a scratch name stays saved under them", arguments: StoreKind.all)
    func renameToScratch(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        try await withMount(fixture.store) { mount in
            let p = mount.path + "/Work.pkg"
            try await offThread {
                try sys(link(p + "/notes.txt", p + "/copy.txt"))
                try sys(rename(p + "/notes.txt", p + "/notes.txt~"))
            }
            let (a, b) = try await offThread { try (statOf(p + "/notes.txt~"), statOf(p + "/copy.txt")) }
            #expect(a.st_ino == b.st_ino && a.st_nlink == 2)
            try await offThread { try sys(unlink(p + "/notes.txt~")) }
            #expect(try await offThread { try statOf(p + "/copy.txt").st_nlink } == 1)
        }
        let tree = try engine.tree("Work.pkg")
        #expect(tree["notes.txt"] == nil)
        #expect(tree["copy.txt"]?.linkOf == nil)
        #expect(try engine.text("Work.pkg", "copy.txt") == Fixture.notesText)
        #expect(try engine.store.checkIntegrity().isClean)
    }

    @Test("cp -al, rsync -H and tar keep hard links in a package", arguments: StoreKind.all)
    func tools(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let source = try temporaryDirectory("docfs-links")
        defer { try? FileManager.default.removeItem(atPath: source) }
        let setup = try await sh(
            "mkdir -p src/d && printf 'shared\\n' > src/a && ln src/a src/d/b && printf 'solo\\n' > src/c"
                + " && tar -cf links.tar -C src .",
            in: source)
        #expect(setup.status == 0, "\(setup.error)")
        try await withMount(fixture.store) { mount in
            let p = mount.path + "/Work.pkg"
            let result = try await sh(
                "mkdir '\(p)/tar' && tar -xf links.tar -C '\(p)/tar'"
                    + " && rsync -aH src/ '\(p)/rsync/'"
                    + " && cp -al '\(p)/sub' '\(p)/sub-linked'",
                in: source)
            #expect(result.status == 0, "\(result.error)")
            for folder in ["tar", "rsync"] {
                let (a, b, c) = try await offThread {
                    try (statOf("\(p)/\(folder)/a"), statOf("\(p)/\(folder)/d/b"), statOf("\(p)/\(folder)/c"))
                }
                #expect(a.st_ino == b.st_ino && a.st_nlink == 2, "\(folder)")
                #expect(c.st_nlink == 1, "\(folder)")
            }
            let (inner, linked) = try await offThread {
                try (statOf(p + "/sub/inner.txt"), statOf(p + "/sub-linked/inner.txt"))
            }
            #expect(inner.st_ino == linked.st_ino && inner.st_nlink == 2)
        }
        let tree = try engine.tree("Work.pkg")
        // Which name is the file and which the link depends on the order the tool made them.
        func sameFile(_ a: String, _ b: String) -> Bool {
            guard let x = tree[a], let y = tree[b] else { return false }
            return x.linkOf == y.id || y.linkOf == x.id
        }
        #expect(sameFile("tar/a", "tar/d/b"))
        #expect(sameFile("rsync/a", "rsync/d/b"))
        #expect(sameFile("sub/inner.txt", "sub-linked/inner.txt"))
        #expect(tree["rsync/c"]?.linkOf == nil)
        #expect(try engine.text("Work.pkg", "rsync/d/b") == "shared\n")
        #expect(try engine.store.checkIntegrity().isClean)
    }
}
