import DocumentEngine
import Foundation
import Testing

/// Kinds, construction, names, keys and directory mutation (FW-1..FW-22, docs/library/apple-behaviours.md).
@Suite struct FileWrapperModelTests {
    @Test("FW-3: a regular wrapper has 0o666, a modification date of now, and no names")
    func regularDefaults() {
        let before = Date()
        let w = FileWrapper(regularFileWithContents: Data("hi".utf8))
        #expect(w.isRegularFile && !w.isDirectory && !w.isSymbolicLink)
        #expect(w.posixPermissions == 0o666)
        let date = w.modificationDate
        #expect(
            date != nil && date! >= before.addingTimeInterval(-1) && date! <= Date().addingTimeInterval(1))
        #expect(w.preferredFilename == nil)
        #expect(w.filename == nil)
        #expect(w.regularFileContents == Data("hi".utf8))
        #expect(w.fileAttributes[.type] as? FileAttributeType == .typeRegular)
        #expect(w.fileAttributes[.size] as? Int == 2)
    }

    @Test("FW-4: directory 0o777 without date; link 0o666")
    func directoryAndLinkDefaults() {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        #expect(d.isDirectory)
        #expect(d.posixPermissions == 0o777)
        #expect(d.modificationDate == nil)
        #expect(d.fileWrappers?.isEmpty == true)
        let l = FileWrapper(symbolicLinkWithDestinationURL: URL(fileURLWithPath: "../target"))
        #expect(l.isSymbolicLink)
        #expect(l.posixPermissions == 0o666)
        // FW-7: relative destinations stay relative.
        #expect((try? l.symbolicLinkDestination()) == "../target")
        #expect(l.symbolicLinkDestinationURL?.relativePath == "../target")
    }

    @Test("FW-2 (deviation): wrong-kind getters return nil instead of raising")
    func wrongKindGetters() {
        let file = FileWrapper(regularFileWithContents: Data())
        let dir = FileWrapper(directoryWithFileWrappers: [:])
        #expect(file.fileWrappers == nil)
        #expect(file.symbolicLinkDestinationURL == nil)
        #expect(dir.regularFileContents == nil)
        #expect(throws: FileWrapperError.self) { try dir.contents() }
        #expect(file.keyForChildFileWrapper(dir) == nil)
    }

    @Test("FW-5: dictionary keys become preferred names only for children without one")
    func directoryInitKeys() {
        let a = FileWrapper(regularFileWithContents: Data("a".utf8))
        let b = FileWrapper(regularFileWithContents: Data("b".utf8))
        b.preferredFilename = "other.txt"
        let d = FileWrapper(directoryWithFileWrappers: ["a.txt": a, "b.txt": b])
        #expect(a.preferredFilename == "a.txt")
        #expect(Set(d.fileWrappers?.keys ?? [:].keys) == ["a.txt", "other.txt"])
        #expect(d.keyForChildFileWrapper(b) == "other.txt")
    }

    @Test("FW-12: duplicate preferred names get n__#$!@%!#__ prefixes built on the name itself")
    func uniquing() {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        let keys = (0..<3).map { _ in d.addRegularFile(withContents: Data(), preferredFilename: "img.png") }
        #expect(keys == ["img.png", "1__#$!@%!#__img.png", "2__#$!@%!#__img.png"])
        // Removing the first frees its key; the next add reuses the plain name.
        d.removeFileWrapper(d.fileWrappers!["img.png"]!)
        #expect(d.addRegularFile(withContents: Data(), preferredFilename: "img.png") == "img.png")
        // Smallest free n, and never a prefix on a prefixed key.
        d.removeFileWrapper(d.fileWrappers!["1__#$!@%!#__img.png"]!)
        #expect(d.addRegularFile(withContents: Data(), preferredFilename: "img.png") == "1__#$!@%!#__img.png")
        #expect(d.addRegularFile(withContents: Data(), preferredFilename: "img.png") == "3__#$!@%!#__img.png")
        #expect(d.fileWrappers?.keys.contains { $0.hasPrefix("1__#$!@%!#__1__") } == false)
    }

    @Test("FW-13/R-9 (Linux policy): keys are case-sensitive, normalization-insensitive")
    func caseSensitivity() {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        #expect(d.addRegularFile(withContents: Data(), preferredFilename: "README") == "README")
        #expect(d.addRegularFile(withContents: Data(), preferredFilename: "readme") == "readme")
        // NFC "é" and NFD "e\u{301}" are the same String, so the second is uniqued.
        #expect(d.addRegularFile(withContents: Data(), preferredFilename: "caf\u{E9}") == "caf\u{E9}")
        let second = d.addRegularFile(withContents: Data(), preferredFilename: "cafe\u{301}")
        #expect(second.hasPrefix("1__#$!@%!#__"))
    }

    @Test("FW-14: adding a child twice returns its key and changes nothing")
    func addIsIdempotent() {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        let c = FileWrapper(regularFileWithContents: Data())
        c.preferredFilename = "x"
        #expect(d.addFileWrapper(c) == "x")
        #expect(d.addFileWrapper(c) == "x")
        #expect(d.fileWrappers?.count == 1)
    }

    @Test("FW-16: addRegularFile creates, names and adds a wrapper")
    func addRegularFile() throws {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        let key = d.addRegularFile(withContents: Data("body".utf8), preferredFilename: "Text.txt")
        let child = try #require(d.fileWrappers?[key])
        #expect(child.preferredFilename == "Text.txt")
        #expect(child.regularFileContents == Data("body".utf8))
    }

    @Test("FW-17/FW-18: remove and key lookup go by identity, not by name")
    func identity() {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        let a = FileWrapper(regularFileWithContents: Data())
        a.preferredFilename = "same"
        let impostor = FileWrapper(regularFileWithContents: Data())
        impostor.preferredFilename = "same"
        d.addFileWrapper(a)
        #expect(d.keyForChildFileWrapper(impostor) == nil)
        #expect(d.keyForFileWrapper(a) == "same")
        d.removeFileWrapper(impostor)  // not a child: nothing happens
        #expect(d.fileWrappers?.count == 1)
        d.removeFileWrapper(a)
        #expect(d.fileWrappers?.isEmpty == true)
        #expect(d.keyForChildFileWrapper(a) == nil)
    }

    @Test("FW-11: changing a preferred name re-keys the child in every parent")
    func rekeyOnRename() {
        let p1 = FileWrapper(directoryWithFileWrappers: [:])
        let p2 = FileWrapper(directoryWithFileWrappers: [:])
        let c = FileWrapper(regularFileWithContents: Data())
        c.preferredFilename = "a"
        p1.addFileWrapper(c)
        p2.addRegularFile(withContents: Data(), preferredFilename: "b")
        p2.addFileWrapper(c)
        c.preferredFilename = "b"
        #expect(p1.keyForChildFileWrapper(c) == "b")
        // In p2 "b" is taken, so the new key is uniqued (FW-8: one key per parent).
        #expect(p2.keyForChildFileWrapper(c) == "1__#$!@%!#__b")
    }

    @Test("FW-19: add and remove delete the directory's modification date")
    func mutationClearsDate() throws {
        let tmp = try TemporaryDirectory()
        try tmp.mkdir("pkg")
        let d = try FileWrapper(url: tmp.url("pkg"))
        #expect(d.modificationDate != nil)
        #expect(d.matchesContents(of: tmp.url("pkg")))
        d.addRegularFile(withContents: Data(), preferredFilename: "new")
        #expect(d.modificationDate == nil)
        #expect(!d.matchesContents(of: tmp.url("pkg")))
    }

    @Test("FW-20: fileWrappers is a snapshot, not a live view")
    func snapshot() {
        let d = FileWrapper(directoryWithFileWrappers: [:])
        let before = d.fileWrappers ?? [:]
        d.addRegularFile(withContents: Data(), preferredFilename: "x")
        #expect(before.isEmpty)
        #expect(d.fileWrappers?.count == 1)
    }

    @Test("FW-22: parents hold children strongly, children do not keep parents alive")
    func ownership() {
        weak var weakParent: FileWrapper?
        let child = FileWrapper(regularFileWithContents: Data())
        child.preferredFilename = "c"
        do {
            let parent = FileWrapper(directoryWithFileWrappers: [:])
            parent.addFileWrapper(child)
            weakParent = parent
            #expect(weakParent != nil)
        }
        #expect(weakParent == nil)
        child.preferredFilename = "d"  // a dead parent must not be messaged
        #expect(child.preferredFilename == "d")
    }

    @Test("FW-6: setting attributes keeps the kind and filters xattrs to user.*")
    func settingAttributes() {
        let w = FileWrapper(regularFileWithContents: Data("x".utf8))
        let date = Date(timeIntervalSince1970: 1_000_000)
        w.fileAttributes = [
            .type: FileAttributeType.typeDirectory, .posixPermissions: 0o640, .modificationDate: date,
            .extendedAttributes: ["user.tag": Data("t".utf8), "security.selinux": Data("s".utf8)],
        ]
        #expect(w.isRegularFile)
        #expect(w.posixPermissions == 0o640)
        #expect(w.modificationDate == date)
        #expect(w.extendedAttributes == ["user.tag": Data("t".utf8)])
    }

    @Test("SR-3 helper: the preferred name is recovered from a uniqued key")
    func preferredNameFromKey() {
        #expect(FileWrapper.preferredFilename(fromKey: "2__#$!@%!#__img.png") == "img.png")
        #expect(FileWrapper.preferredFilename(fromKey: "img.png") == "img.png")
        #expect(FileWrapper.preferredFilename(fromKey: "x__#$!@%!#__img.png") == "x__#$!@%!#__img.png")
    }

    @Test("File names: empty, dot names, slash, NUL and over 255 bytes are refused")
    func fileNameRules() {
        for bad in ["", ".", "..", "a/b", "a\u{0}b", String(repeating: "x", count: 256)] {
            #expect(FileName.problem(with: bad) != nil, "\(bad.debugDescription)")
        }
        #expect(FileName.problem(with: String(repeating: "é", count: 127)) == nil)  // 254 bytes
        #expect(FileName.problem(with: "1__#$!@%!#__img.png") == nil)
    }

    @Test("FW-11, FW-15, FW-2, FW-6: programming errors (and cycles) trap as Apple raises")
    func programmingErrorsTrap() async {
        await #expect(processExitsWith: .failure) {
            let w = FileWrapper(regularFileWithContents: Data())
            w.preferredFilename = ""
        }
        await #expect(processExitsWith: .failure) {
            let d = FileWrapper(directoryWithFileWrappers: [:])
            d.addFileWrapper(FileWrapper(regularFileWithContents: Data()))
        }
        await #expect(processExitsWith: .failure) {
            let f = FileWrapper(regularFileWithContents: Data())
            let c = FileWrapper(regularFileWithContents: Data())
            c.preferredFilename = "c"
            f.addFileWrapper(c)
        }
        await #expect(processExitsWith: .failure) {
            let f = FileWrapper(regularFileWithContents: Data())
            f.fileAttributes = [.posixPermissions: 0o644]
        }
        await #expect(processExitsWith: .failure) {
            // A cycle would make every recursive walk (write, serialize, match) run for ever.
            let a = FileWrapper(directoryWithFileWrappers: [:])
            let b = FileWrapper(directoryWithFileWrappers: [:])
            a.preferredFilename = "a"
            b.preferredFilename = "b"
            a.addFileWrapper(b)
            b.addFileWrapper(a)
        }
    }
}
