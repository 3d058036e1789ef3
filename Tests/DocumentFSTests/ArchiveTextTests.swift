import DocumentEngine
import DocumentFS
import Foundation
import SampleDocuments
import StoreTestSupport
import TestSupport
import Testing
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// `-o archives=xml`: binary property lists and keyed archives read as XML text
/// through a real mount, edits by real tools are stored as binary property lists again, and
/// text that is not one is refused while the stored archive stays as it was.
@Suite(.serialized)
struct ArchiveTextTests {
    static let document = "Things I Own.mystuff"
    static let archive = "things.data"
    static let handmade = "every-type.plist"

    /// A hand-made property list with every type: integers of each binary width, a float32 and
    /// a double, dates with and without a fraction, data, a UID, nested containers and a string
    /// that needs UTF-16.
    static let everyType: PropertyListValue = .dictionary([
        .init(key: "one byte", value: .integer(200)),
        .init(key: "two bytes", value: .integer(40_000)),
        .init(key: "four bytes", value: .integer(3_000_000_000)),
        .init(key: "eight bytes", value: .integer(-5)),
        .init(key: "sixteen bytes", value: .integer(Int128(UInt64.max))),
        .init(key: "real", value: .real(0.1)),
        .init(key: "date", value: .date(786_000_000)),
        .init(key: "date with a fraction", value: .date(786_000_000.25)),
        .init(key: "data", value: .data(Data([0, 1, 2, 254, 255]))),
        .init(key: "uid", value: .uid(7)),
        .init(key: "yes", value: .bool(true)),
        .init(key: "text", value: .string("Zoë ⌘ 🚲")),
        .init(
            key: "nested",
            value: .array([.array([.integer(1), .dictionary([.init(key: "deep", value: .string("here"))])])])),
    ])

    static let assembledName = "assembled.plist"

    /// A binary property list put together byte by byte, not by any encoder: integers in 1, 2,
    /// 4 and 8 bytes (255, 300, 70000, -5), a UID, a date, data, and an array nested in the
    /// dictionary, with a one-byte offset table.
    static func assembled() -> Data {
        let objects: [[UInt8]] = [
            [0xD6] + Array(1...6) + Array(7...12),  // a dictionary of 6: key refs, then value refs
            [0x52] + Array("i1".utf8), [0x52] + Array("i2".utf8), [0x52] + Array("i4".utf8),
            [0x52] + Array("i8".utf8), [0x53] + Array("uid".utf8), [0x56] + Array("nested".utf8),
            [0x10, 0xFF], [0x11, 0x01, 0x2C], [0x12, 0x00, 0x01, 0x11, 0x70],
            [0x13, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFB],
            [0x80, 0x07],
            [0xA2, 13, 14],  // an array of a date and data
            [0x33] + withUnsafeBytes(of: (786_000_000.5 as Double).bitPattern.bigEndian, Array.init),
            [0x43] + Array("abc".utf8),
        ]
        var bytes = Array("bplist00".utf8)
        var offsets: [UInt8] = []
        for object in objects {
            offsets.append(UInt8(bytes.count))
            bytes += object
        }
        let tableOffset = UInt64(bytes.count)
        bytes += offsets
        bytes += [0, 0, 0, 0, 0, 0, 1, 1]  // 5 unused, sort version, offset size 1, reference size 1
        bytes += withUnsafeBytes(of: UInt64(objects.count).bigEndian, Array.init)
        bytes += withUnsafeBytes(of: UInt64(0).bigEndian, Array.init)
        bytes += withUnsafeBytes(of: tableOffset.bigEndian, Array.init)
        return Data(bytes)
    }

    /// The demo store (MyStuff's things document among others) plus a hand-made property list
    /// with every type, and one assembled byte by byte, in the things package.
    static func fixture(_ kind: StoreKind) async throws -> (StoreFixture, binary: Data, handmade: Data) {
        let stores = try StoreFixture(kind, name: "A")
        try await DemoDocuments.populate(stores.store)
        let store = stores.store
        let info = try #require(try store.document(named: document))
        let handmade = PropertyList.encodeBinary(everyType)
        let ids = try store.makeNodeIDs(count: 2)
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.origin = "test"
        changes.nodes = [
            NodeRecord(
                id: ids[0], document: info.id, parent: info.root, name: Self.handmade, kind: .regularFile,
                permissions: 0o644, modified: .now),
            NodeRecord(
                id: ids[1], document: info.id, parent: info.root, name: Self.assembledName,
                kind: .regularFile,
                permissions: 0o644, modified: .now),
        ]
        changes.contents = [
            ids[0]: .replace(DataContentsSource(handmade)), ids[1]: .replace(DataContentsSource(assembled())),
        ]
        _ = try store.save(changes)
        let binary = try stored(store, archive)
        #expect(PropertyList.isBinary(binary))
        return (stores, binary, handmade)
    }

    static func stored(_ store: any DocumentStore, _ name: String) throws -> Data {
        let info = try #require(try store.document(named: document))
        let record = try #require(try store.nodes(of: info.id).first { $0.name == name })
        return try store.readContents(of: record.id, at: nil, offset: 0, count: Int(record.size))
    }

    static func versionCount(_ store: any DocumentStore) throws -> Int {
        try store.versions(of: try #require(try store.document(named: document)).id).count
    }

    func mountAsText(_ store: any FileSystemStore, _ body: (TestMount) async throws -> Void) async throws {
        try await withMount(store, configure: { $0.fileSystem.archivesAsText = true }) { try await body($0) }
    }

    /// The things a MyStuff app sees in the store now.
    @MainActor
    static func things(_ store: any DocumentStore) async throws -> [String] {
        let document = ThingsDocument(store: store, name: Self.document)
        guard await document.open() else { throw TestFailure("the MyStuff document did not open") }
        let names = document.things.map(\.name)
        await document.close()
        return names
    }

    @Test(
        "reads: an archive and a hand-made plist read as XML text with matching sizes; others and the option's absence show stored bytes",
        arguments: StoreKind.all)
    func textView(_ kind: StoreKind) async throws {
        let (fixture, binary, handmade) = try await Self.fixture(kind)
        let expected = PropertyList.encodeXML(try PropertyList.decodeBinary(binary))
        let expectedHandmade = PropertyList.encodeXML(Self.everyType)
        try await mountAsText(fixture.store) { mount in
            let package = mount.url(Self.document)
            let path = package + "/" + Self.archive
            let (size, text) = try await offThread {
                (try statOf(path).st_size, try Data(contentsOf: URL(fileURLWithPath: path)))
            }
            let listed = try await sh("ls -l \(quoted(package))", in: "/")
            #expect(Int(size) == expected.count)
            #expect(text == expected)
            #expect(String(decoding: text, as: UTF8.self).contains("<string>NSKeyedArchiver</string>"))
            #expect(listed.output.contains(" \(expected.count) "), "ls -l: \(listed.output)")
            let grep = try await sh("grep -c '<key>\\$objects</key>' \(quoted(path))", in: "/")
            #expect(grep.output.trimmingCharacters(in: .whitespacesAndNewlines) == "1")
            let hand = try await offThread {
                try Data(contentsOf: URL(fileURLWithPath: package + "/" + Self.handmade))
            }
            #expect(hand == expectedHandmade)
            #expect(String(decoding: hand, as: UTF8.self).contains("<integer>18446744073709551615</integer>"))
            // The list assembled by hand: every width read, the UID as CF$UID, the date to the
            // half second, and the size stat gives is the text's.
            let assembledPath = package + "/" + Self.assembledName
            let (assembled, assembledSize) = try await offThread {
                (
                    try String(contentsOfFile: assembledPath, encoding: .utf8),
                    try statOf(assembledPath).st_size
                )
            }
            #expect(Int(assembledSize) == assembled.utf8.count)
            for piece in [
                "<integer>255</integer>", "<integer>300</integer>", "<integer>70000</integer>",
                "<integer>-5</integer>", "<key>CF$UID</key>\n\t\t<integer>7</integer>",
                "<date>2025-11-28T05:20:00.5Z</date>", "<data>\n\t\tYWJj\n\t\t</data>",
            ] {
                #expect(assembled.contains(piece), "\(piece) in \(assembled)")
            }
            // Not a property list: as stored.
            let image = try await offThread { try statOf(package + "/image.png").st_size }
            #expect(image > 0)
            let png = try await offThread {
                try Data(contentsOf: URL(fileURLWithPath: package + "/image.png"))
            }
            #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]))
        }
        _ = handmade
        // Without the option the mount shows the stored bytes.
        try await withMount(fixture.store) { mount in
            let path = mount.url(Self.document) + "/" + Self.archive
            let shown = try await offThread { try Data(contentsOf: URL(fileURLWithPath: path)) }
            #expect(shown == binary)
        }
    }

    @Test(
        "the unchanged text written back (in place, and by sed -i) stores the byte-identical archive",
        arguments: StoreKind.all)
    func byteIdentical(_ kind: StoreKind) async throws {
        let (fixture, binary, handmade) = try await Self.fixture(kind)
        let versions = try Self.versionCount(fixture.store)
        try await mountAsText(fixture.store) { mount in
            let package = mount.url(Self.document)
            let script = """
                cat things.data > /tmp/docfs-archive-$$ && cat /tmp/docfs-archive-$$ > things.data \
                && rm /tmp/docfs-archive-$$ && sed -i 's/NSKeyedArchiver/NSKeyedArchiver/' things.data \
                && sed -i 's/here/here/' \(Self.handmade) && cat \(Self.assembledName) > /tmp/docfs-assembled-$$ \
                && cat /tmp/docfs-assembled-$$ > \(Self.assembledName) && rm /tmp/docfs-assembled-$$
                """
            let result = try await sh(script, in: package)
            #expect(result.status == 0, "\(result.error)")
            _ = try await waitUntil(timeout: 3) { try Self.versionCount(fixture.store) > versions }
            #expect(try Self.stored(fixture.store, Self.archive) == binary)
            #expect(try Self.stored(fixture.store, Self.handmade) == handmade)
            // Its 8-byte -5 and 4-byte 70000 stay as assembled: the text shown stores those bytes.
            #expect(try Self.stored(fixture.store, Self.assembledName) == Self.assembled())
        }
        #expect(try await Self.things(fixture.store) == ["Bicycle", "Guitar", "Telescope", "Kayak"])
    }

    @Test(
        "edits by sed -i, vim, nano and GIO's safe save are stored as binary archives the MyStuff document reads",
        arguments: StoreKind.all)
    func editsRoundTrip(_ kind: StoreKind) async throws {
        let (fixture, _, _) = try await Self.fixture(kind)
        try await mountAsText(fixture.store) { mount in
            let package = mount.url(Self.document)
            let sed = try await sh("sed -i 's/<string>Guitar</<string>Banjo</' things.data", in: package)
            #expect(sed.status == 0, "\(sed.error)")
            let afterSed = try await waitUntil(timeout: 3) {
                let stored = try Self.stored(fixture.store, Self.archive)
                return PropertyList.isBinary(stored)
                    && String(decoding: stored, as: UTF8.self).contains("Banjo")
            }
            #expect(afterSed != nil, "the store did not get sed's edit as a binary archive")
            #expect(try await Self.things(fixture.store) == ["Bicycle", "Banjo", "Telescope", "Kayak"])

            let vim = try await sh(
                """
                TERM=dumb vim -N -u NONE -i NONE -es -c 'set swapfile directory=. backupskip=' \
                -c '%s/<string>Kayak</<string>Canoe</' -c 'wq' things.data
                """, in: package)
            #expect(vim.status == 0, "vim: \(vim.output) \(vim.error)")
            let afterVim = try await waitUntil(timeout: 3) {
                String(decoding: try Self.stored(fixture.store, Self.archive), as: UTF8.self).contains(
                    "Canoe")
            }
            #expect(afterVim != nil, "the store did not get vim's edit")
            #expect(PropertyList.isBinary(try Self.stored(fixture.store, Self.archive)))
            #expect(try await Self.things(fixture.store) == ["Bicycle", "Banjo", "Telescope", "Canoe"])
            // The mount shows the edited text.
            let text = try await offThread {
                try String(contentsOfFile: package + "/" + Self.archive, encoding: .utf8)
            }
            #expect(text.contains("<string>Canoe</string>") && text.contains("<string>Banjo</string>"))

            // nano, in place on a terminal: replace all, write out, exit.
            let lock = ".things.data.swp"
            let keys = """
                n=0; until [ -e \(lock) ]; do sleep 0.05; n=$((n+1)); [ $n -gt 100 ] && break; done
                sleep 0.3; printf '\\034'; sleep 0.3; printf 'Telescope\\r'; sleep 0.3; printf 'Microscope\\r'
                sleep 0.3; printf 'a'; sleep 0.3; printf '\\017'; sleep 0.3; printf '\\r'; sleep 0.5; printf '\\030'
                n=0; while [ -e \(lock) ]; do sleep 0.05; n=$((n+1)); [ $n -gt 100 ] && break; done
                exit 0
                """
            let nano = try await sh(
                """
                ( \(keys) ) | TERM=xterm script -qfec "nano -I --locking things.data" /dev/null >/dev/null
                """, in: package, seconds: 20)
            #expect(nano.status == 0, "nano: \(nano.error)")
            let afterNano = try await waitUntil(timeout: 3) {
                String(decoding: try Self.stored(fixture.store, Self.archive), as: UTF8.self).contains(
                    "Microscope")
            }
            #expect(afterNano != nil, "the store did not get nano's edit")
            #expect(try await Self.things(fixture.store) == ["Bicycle", "Banjo", "Microscope", "Canoe"])

            // GIO's safe save (a GUI editor's): a temporary file renamed over it.
            let gio = try await sh(
                "sed 's/<string>Canoe</<string>Raft</' things.data | gio save things.data", in: package)
            #expect(gio.status == 0, "gio save: \(gio.output) \(gio.error)")
            let afterGIO = try await waitUntil(timeout: 3) {
                String(decoding: try Self.stored(fixture.store, Self.archive), as: UTF8.self).contains("Raft")
            }
            #expect(afterGIO != nil, "the store did not get GIO's save")
            #expect(try await Self.things(fixture.store) == ["Bicycle", "Banjo", "Microscope", "Raft"])

            // The hand-made list: an integer edited, every other value as it was.
            let edit = try await sh(
                "sed -i 's/<integer>40000</<integer>40001</' \(Self.handmade)", in: package)
            #expect(edit.status == 0)
            _ = try await waitUntil(timeout: 3) {
                (try? PropertyList.decodeBinary(Self.stored(fixture.store, Self.handmade))) != Self.everyType
            }
            guard case .dictionary(var entries) = Self.everyType else { return }
            entries[1].value = .integer(40_001)
            #expect(
                try PropertyList.decodeBinary(Self.stored(fixture.store, Self.handmade))
                    == .dictionary(entries))
        }
        #expect(try fixture.store.checkIntegrity().isClean)
    }

    @Test(
        "text that is not a property list, or not an archive, is refused with EINVAL; the stored archive stays",
        arguments: StoreKind.all)
    func refused(_ kind: StoreKind) async throws {
        let (fixture, binary, _) = try await Self.fixture(kind)
        let versions = try Self.versionCount(fixture.store)
        try await mountAsText(fixture.store) { mount in
            let path = mount.url(Self.document) + "/" + Self.archive
            let original = try await offThread { try String(contentsOfFile: path, encoding: .utf8) }
            let broken = original.replacingOccurrences(of: "</dict>\n</plist>", with: "</dic>\n</plist>")
            let notAnArchive = original.replacingOccurrences(
                of: "<string>NSKeyedArchiver</string>", with: "<string>Something else</string>")
            for text in [broken, "not a property list\n", notAnArchive] {
                // In place: the close is refused.
                let (closed, closeErrno) = try await offThread { () throws -> (Int32, Int32) in
                    let fd = try sys(open(path, O_WRONLY | O_TRUNC), "open")
                    try writeAll(fd, text)
                    let rc = close(fd)
                    return (rc, rc < 0 ? errno : 0)
                }
                #expect(closed == -1 && closeErrno == EINVAL, "close: \(closed) errno \(closeErrno)")
                // The text stays in the mount's file; fsync is refused as well.
                let (seen, fsyncErrno) = try await offThread { () throws -> (String, Int32) in
                    let fd = try sys(open(path, O_RDWR), "open")
                    defer { close(fd) }
                    let rc = fsync(fd)
                    return (try String(contentsOfFile: path, encoding: .utf8), rc < 0 ? errno : 0)
                }
                #expect(seen == text)
                #expect(fsyncErrno == EINVAL)
                #expect(try Self.stored(fixture.store, Self.archive) == binary)
            }
            // A safe save (sed -i) of bad text: the rename is refused, the original stays.
            try await offThread {
                let fd = try sys(open(path, O_WRONLY | O_TRUNC), "open")
                try writeAll(fd, original)
                #expect(close(fd) == 0)
            }
            let sed = try await sh(
                "sed -i 's/<dict>/<dictionary>/' things.data", in: mount.url(Self.document))
            #expect(
                sed.status != 0 && sed.error.contains("Invalid argument"), "sed: \(sed.status) \(sed.error)")
            let shown = try await offThread { try String(contentsOfFile: path, encoding: .utf8) }
            #expect(shown == original)
            // Past the quiet interval: what was saved meanwhile (the times) kept the archive's bytes.
            try await Task.sleep(for: .milliseconds(1500))
            #expect(try Self.stored(fixture.store, Self.archive) == binary)
            #expect(try Self.versionCount(fixture.store) <= versions + 1)
        }
        #expect(try await Self.things(fixture.store) == ["Bicycle", "Guitar", "Telescope", "Kayak"])
    }
}
