import CLinuxSupport
import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

/// Whole-file saves store about the size of the change: chunk boundaries
/// follow the content, so an editor that writes a new file shifts no chunk but the ones it
/// changed.
@Suite struct IncrementalStorageTests {
    /// Lines of prose-like text, `count` bytes, the same for the same seed.
    static func text(_ count: Int, seed: UInt64) -> Data {
        let words = [
            "document", "wrapper", "store", "version", "chunk", "the", "a", "of", "keeps", "saves", "file",
        ]
        var state = seed &* 6_364_136_223_846_793_005 &+ 1
        var line = 0
        var out = Data()
        out.reserveCapacity(count + 200)
        while out.count < count {
            line += 1
            var sentence = "\(line):"
            for _ in 0..<(8 + Int(state >> 60)) {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                sentence += " " + words[Int(state >> 33) % words.count]
            }
            out.append(contentsOf: Array((sentence + ".\n").utf8))
        }
        return out.prefix(count)
    }

    static func save(_ store: any DocumentStore, _ document: DocumentInfo, _ bytes: Data) throws -> SaveResult
    {
        var changes = DocumentChanges(
            document: document.id, base: try store.document(document.id).currentVersion)
        changes.contents[document.root] = .replace(DataContentsSource(bytes))
        return try store.save(changes)
    }

    @Test(
        "A whole new file with a line inserted, appended or changed stores about that change",
        arguments: StoreKind.everyBackend)
    func wholeFileSaves(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let chunk = Int64(store.chunkSize)
        let document = try store.createDocument(
            named: "big.txt", kind: .flat, type: nil, permissions: nil, origin: "")
        let original = Self.text(16 << 20, seed: 1)
        let first = try Self.save(store, document, original)
        #expect(first.bytesWritten == Int64(original.count))

        let inserted = Data("a new first line\n".utf8) + original
        let atStart = try Self.save(store, document, inserted)
        #expect(
            atStart.bytesWritten <= 2 * chunk,
            "inserting a line at the start stored \(atStart.bytesWritten) bytes")

        var middle = inserted
        middle.replaceSubrange(8_000_000..<8_000_010, with: Data("CHANGED!!!".utf8))
        let inTheMiddle = try Self.save(store, document, middle)
        #expect(
            inTheMiddle.bytesWritten <= 2 * chunk,
            "a change in the middle stored \(inTheMiddle.bytesWritten) bytes")

        let appended = middle + Data("one more line\n".utf8)
        let atEnd = try Self.save(store, document, appended)
        #expect(atEnd.bytesWritten <= chunk, "appending a line stored \(atEnd.bytesWritten) bytes")

        // Every version reads back whole.
        let versions = try store.versions(of: document.id).map(\.id)
        for (version, bytes) in zip(versions.suffix(4), [original, inserted, middle, appended]) {
            #expect(
                try store.readContents(of: document.root, at: version, offset: 0, count: bytes.count) == bytes
            )
        }
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "A small write in a large file, saved as its changed page, stores at most about two chunks",
        arguments: StoreKind.everyBackend)
    func smallWriteInALargeFile(_ kind: StoreKind) throws {
        let fixture = try StoreFixture(kind)
        let store = fixture.store
        let chunk = store.chunkSize
        let document = try store.createDocument(
            named: "big.bin", kind: .flat, type: nil, permissions: nil, origin: "")
        let original = sampleBytes(8 << 20, seed: 2)
        _ = try Self.save(store, document, original)
        var edited = original
        let at = 5 * chunk + 1234
        edited.replaceSubrange(at..<at + 4096, with: sampleBytes(4096, seed: 3))
        var changes = DocumentChanges(
            document: document.id, base: try store.document(document.id).currentVersion)
        changes.contents[document.root] = .sparse(
            size: Int64(edited.count), chunks: [at / chunk, (at + 4095) / chunk],
            source: DataContentsSource(edited))
        let saved = try store.save(changes)
        #expect(saved.bytesWritten <= 2 * Int64(chunk), "a 4 KiB write stored \(saved.bytesWritten) bytes")
        #expect(try store.readContents(of: document.root, at: nil, offset: 0, count: edited.count) == edited)
        #expect(try store.checkIntegrity().isClean)
    }

    @Test(
        "sed -i '1i' on a large text wrapper through the mount stores about one chunk",
        arguments: StoreKind.all)
    func sedInsertThroughTheMount(_ kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind, chunkSize: 256 * 1024, name: "Sed")
        let store = fixture.store
        let package = try store.createDocument(
            named: "Text.pkg", kind: .package, type: nil, permissions: 0o755, origin: "")
        let id = try store.makeNodeIDs(count: 1)[0]
        let original = Self.text(8 << 20, seed: 4)
        var changes = DocumentChanges(document: package.id, base: package.currentVersion)
        changes.nodes = [
            NodeRecord(
                id: id, document: package.id, parent: package.root, name: "long.txt", kind: .regularFile,
                permissions: 0o644)
        ]
        changes.contents[id] = .replace(DataContentsSource(original))
        _ = try store.save(changes)
        let versionsBefore = try store.versions(of: package.id).count
        try await withMount(store) { mount in
            let before = store.statistics
            let result = try await sh(
                "sed -i '1i a new first line' long.txt && sync", in: mount.url("Text.pkg"))
            #expect(result.status == 0, "\(result.error)")
            try await expectEventually("the save") {
                try store.versions(of: package.id).count > versionsBefore
            }
            let written = store.statistics.bytesWritten - before.bytesWritten
            #expect(
                written <= 2 * 256 * 1024,
                "sed -i '1i' stored \(written) bytes of a \(original.count)-byte file")
        }
        let now = try #require(try store.nodes(of: package.id).first { $0.name == "long.txt" })
        let expected = Data("a new first line\n".utf8) + original
        #expect(try store.readContents(of: now.id, at: nil, offset: 0, count: expected.count + 1) == expected)
        #expect(try store.nodes(of: package.id).map(\.name).sorted() == ["Text.pkg", "long.txt"])
    }
}

/// The mount applies the store's retention policy in the background, without being asked.
@Suite struct BackgroundRetentionTests {
    @Test(
        "a mount thins history by the store's policy, sparing the versions it reads from",
        arguments: StoreKind.all)
    func mountCollects(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        let store = fixture.store
        try store.setRetentionPolicy(.currentOnly)
        let work = try #require(try store.document(named: "Work.pkg"))
        // Four saves add four versions; the mount, collecting every second, leaves the current one
        // (and the base it reads from).
        try await withMount(store, configure: { $0.fileSystem.collectionInterval = .seconds(1) }) { mount in
            for i in 0..<4 {
                let result = try await sh(
                    "printf 'save \(i)\\n' >> notes.txt && sync notes.txt", in: mount.url("Work.pkg"))
                #expect(result.status == 0, "\(result.error)")
            }
            let thinned = try await expectEventually("history thinned by the mount", timeout: 20) {
                try store.versions(of: work.id).count <= 2
            }
            #expect(thinned)
            let text = try await sh("cat notes.txt", in: mount.url("Work.pkg"))
            #expect(text.output.hasSuffix("save 3\n"))
        }
        #expect(try store.checkIntegrity().isClean)
    }
}

/// A save that is still committing when `copy_file_range` makes the file it saved a copy of
/// another: when it finishes it must not take the file back to what it saved (an empty file),
/// or the copy reads as zeros and its next save stores them.
@Suite struct SaveRacingCopyTests {
    @Test("a group commit that finishes after copy_file_range replaced the file keeps the copy")
    func saveRacingCopy() async throws {
        let fixture = try Fixture.small(.memory)
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        let engine = try Engine(fixture)
        try await withMount(proxy) { mount in
            let w = mount.url("Work.pkg")
            let target = try await offThread {
                try sys(open(w + "/copy.txt", O_WRONLY | O_CREAT | O_EXCL, 0o644))
            }
            defer { close(target) }
            // A close of another file of the package: its group commit takes in the new, empty
            // copy.txt too, and waits at the gate.
            proxy.holdAllTransactions()
            try await offThread { try writeText(w + "/notes.txt", "changed\n") }
            let waiting = try await waitUntil(timeout: 3) { proxy.waitingTransactions > 0 }
            #expect(waiting != nil, "the committer never started its save")
            // Meanwhile copy.txt becomes a copy of sub/inner.txt, sharing its chunks.
            let copied = try await offThread { () throws -> Int in
                let source = try sys(open(w + "/sub/inner.txt", O_RDONLY))
                defer { close(source) }
                return docfs_copy_file_range(source, target, 1 << 20)
            }
            #expect(copied == Fixture.innerText.utf8.count)
            proxy.releaseTransactions()
            try await expectEventually("notes.txt saved") {
                try engine.text("Work.pkg", "notes.txt") == "changed\n"
            }
            #expect(try await offThread { try readText(w + "/copy.txt") } == Fixture.innerText)
            try await offThread { try sys(fsync(target)) }
            #expect(try engine.text("Work.pkg", "copy.txt") == Fixture.innerText)
        }
    }
}

/// `copy_file_range(2)` inside a mount: a whole saved file copied into a new
/// one shares its chunks; any other range is copied right.
@Suite struct CopyOffloadTests {
    @Test(
        "cp of a large wrapper to another name shares its chunks; partial copies are exact",
        arguments: StoreKind.all)
    func copyShares(_ kind: StoreKind) async throws {
        let fixture = try StoreFixture(kind, chunkSize: 256 * 1024, name: "Copy")
        let store = fixture.store
        let package = try store.createDocument(
            named: "Big.pkg", kind: .package, type: nil, permissions: 0o755, origin: "")
        let id = try store.makeNodeIDs(count: 1)[0]
        let bytes = sampleBytes(32 << 20, seed: 11)
        var changes = DocumentChanges(document: package.id, base: package.currentVersion)
        changes.nodes = [
            NodeRecord(
                id: id, document: package.id, parent: package.root, name: "big.bin", kind: .regularFile,
                permissions: 0o644)
        ]
        changes.contents[id] = .replace(DataContentsSource(bytes))
        _ = try store.save(changes)
        try await withMount(store) { mount in
            let directory = mount.url("Big.pkg")
            let before = store.statistics
            let copied = try await sh(
                "python3 -c 'import os; a = os.open(\"big.bin\", os.O_RDONLY); b = os.open(\"copy.bin\", os.O_WRONLY | os.O_CREAT, 0o644); n = 0\nwhile True:\n    k = os.copy_file_range(a, b, 1 << 30)\n    if k == 0: break\n    n += k\nprint(n); os.fsync(b)' && cp big.bin cp.bin && sync cp.bin",
                in: directory)
            #expect(copied.status == 0, "\(copied.error)")
            #expect(copied.output == "\(bytes.count)\n")
            let after = store.statistics
            #expect(
                after.bytesWritten - before.bytesWritten <= 1 << 20,
                "the copies wrote \(after.bytesWritten - before.bytesWritten) content bytes")
            #expect(
                after.bytesRead - before.bytesRead <= 1 << 20,
                "the copies read \(after.bytesRead - before.bytesRead) content bytes")
            let same = try await sh("cmp big.bin copy.bin && cmp big.bin cp.bin && echo same", in: directory)
            #expect(same.output == "same\n", "\(same.error)")

            // A range at an offset into a file that has bytes: copied, not shared.
            let partial = try await sh(
                "head -c 1000 big.bin > part.bin && python3 -c 'import os; a = os.open(\"big.bin\", os.O_RDONLY); b = os.open(\"part.bin\", os.O_WRONLY); print(os.copy_file_range(a, b, 300000, 5000, 700))' && cmp -n 700 part.bin big.bin && echo ok",
                in: directory)
            #expect(partial.status == 0, "\(partial.error)")
            let expected = bytes.prefix(700) + bytes.subdata(in: 5000..<305_000)
            let part = try Data(contentsOf: URL(fileURLWithPath: directory + "/part.bin"))
            #expect(part == expected)
        }
        let nodes = try store.nodes(of: package.id)
        for name in ["copy.bin", "cp.bin"] {
            let node = try #require(nodes.first { $0.name == name })
            #expect(try store.readContents(of: node.id, at: nil, offset: 0, count: bytes.count + 1) == bytes)
        }
        #expect(try store.checkIntegrity().isClean)
    }
}

/// `fallocate(2)` modes through the mount.
@Suite struct FallocateTests {
    @Test(
        "fallocate: allocate, KEEP_SIZE, PUNCH_HOLE and ZERO_RANGE give ext4's bytes and sizes",
        arguments: StoreKind.all)
    func zeroRange(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        defer { fixture.remove() }
        try await withMount(fixture.store) { mount in
            let script = """
                import ctypes, os
                libc = ctypes.CDLL(None, use_errno=True)
                libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
                KEEP, PUNCH, COLLAPSE, ZERO, INSERT = 1, 2, 8, 16, 32
                def fa(fd, mode, offset, length):
                    return 0 if libc.fallocate(fd, mode, offset, length) == 0 else ctypes.get_errno()
                fd = os.open("f.bin", os.O_RDWR | os.O_CREAT, 0o644)
                os.write(fd, b"x" * 20000)
                r = [fa(fd, ZERO, 1000, 3000), os.fstat(fd).st_size]
                r += [fa(fd, ZERO | KEEP, 19000, 5000), os.fstat(fd).st_size]
                r += [fa(fd, ZERO, 19000, 5000), os.fstat(fd).st_size]
                r += [fa(fd, PUNCH | KEEP, 5000, 100), os.fstat(fd).st_size]
                r += [fa(fd, 0, 0, 30000), os.fstat(fd).st_size]
                r += [fa(fd, COLLAPSE, 4096, 4096), fa(fd, INSERT, 4096, 4096)]
                data = os.pread(fd, 40000, 0)
                os.close(fd)
                expected = bytearray(b"x" * 20000)
                expected[1000:4000] = bytes(3000)
                expected[19000:20000] = bytes(1000)
                expected += bytes(4000)
                expected[5000:5100] = bytes(100)
                expected += bytes(6000)
                print(r, data == bytes(expected))
                """
            try script.write(
                toFile: NSTemporaryDirectory() + "/docfs-fallocate.py", atomically: true, encoding: .utf8)
            let result = try await sh(
                "python3 \(NSTemporaryDirectory())/docfs-fallocate.py", in: mount.url("Work.pkg"))
            #expect(result.status == 0, "\(result.error)")
            print("fallocate: \(result.output)")
            // COLLAPSE_RANGE and INSERT_RANGE: the kernel's FUSE answers EOPNOTSUPP (95) itself.
            #expect(result.output.hasPrefix("[0, 20000, 0, 20000, 0, 24000, 0, 24000, 0, 30000, 95, 95]"))
            #expect(result.output.hasSuffix("True\n"))
        }
    }
}
