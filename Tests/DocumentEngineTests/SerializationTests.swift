import Foundation
import Testing
import TestSupport

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

/// Serialized representation: SR-1 (one opaque, here documented, byte string for a whole tree),
/// SR-2 (nil when a lazy part cannot be loaded), SR-3 (preferred names survive, or come from the
/// key), and the decoder's safety on malformed input. SR-4 (NSSecureCoding) is not implemented.
@Suite struct SerializationTests {
    // MARK: Round trip (SR-1, SR-3)

    @Test(
        "SR-1, SR-3: files, folders, links, permissions, dates, xattrs and uniqued keys survive a round trip")
    func roundTrip() throws {
        let root = makeSampleTree()
        let data = try root.serialized()
        #expect(root.serializedRepresentation == data)

        let decoded = try FileWrapper(validatingSerializedRepresentation: data)
        #expect(differences(root, decoded).isEmpty, "\(differences(root, decoded))")
        let failable = try #require(FileWrapper(serializedRepresentation: data))
        #expect(differences(root, failable).isEmpty)
        // A slice of a larger `Data` (indices not starting at 0) decodes the same.
        let slice = (Data([9, 9, 9]) + data)[3...]
        #expect(differences(root, try FileWrapper(validatingSerializedRepresentation: slice)).isEmpty)

        // SR-3: both images keep their preferred name and their keys are as encoded.
        let children = try #require(decoded.fileWrappers)
        #expect(
            children.keys.sorted() == [
                "1__#$!@%!#__image.png", "abs", "big.bin", "empty", "image.png", "rel", "sub",
            ])
        #expect(children["image.png"]?.preferredFilename == "image.png")
        #expect(children["1__#$!@%!#__image.png"]?.preferredFilename == "image.png")
        #expect(decoded.preferredFilename == "Notes.pkg")
        #expect(children["empty"]?.regularFileContents == Data())
        #expect(children["big.bin"]?.regularFileContents?.count == 3 << 20)
        #expect(try children["rel"]?.symbolicLinkDestination() == "sub/deeper/note.md")
        #expect(try children["abs"]?.symbolicLinkDestination() == "/etc/hostname")
        #expect(children["big.bin"]?.posixPermissions == 0o4755)
        // Nanoseconds survive: the decoded date is the very same `Date`.
        #expect(children["big.bin"]?.modificationDate == Date(timeIntervalSince1970: 1_700_000_000.123456789))
        #expect(children["empty"]?.modificationDate == Date(timeIntervalSince1970: -1.5))
        #expect(decoded.modificationDate == nil)
        let note = try #require(children["sub"]?.fileWrappers?["deeper"]?.fileWrappers?["note.md"])
        #expect(note.extendedAttributes == ["user.tag": Data("red".utf8), "user.empty": Data()])
        #expect(decoded.filename == nil && note.filename == nil)
    }

    @Test("SR-1: a regular file or a link can be the root; an empty folder too")
    func nonDirectoryRoots() throws {
        for wrapper in [
            FileWrapper(regularFileWithContents: Data("x".utf8)),
            FileWrapper(symbolicLinkWithDestination: "../target"),
            FileWrapper(directoryWithFileWrappers: [:]),
        ] {
            let decoded = try FileWrapper(validatingSerializedRepresentation: try wrapper.serialized())
            #expect(differences(wrapper, decoded).isEmpty)
            #expect(decoded.preferredFilename == nil)  // the root had none
        }
    }

    @Test("SR-3: decoded children are adopted, so a new preferred name re-keys them (FW-11)")
    func decodedChildrenAreAdopted() throws {
        let decoded = try FileWrapper(validatingSerializedRepresentation: try makeSampleTree().serialized())
        let empty = try #require(decoded.fileWrappers?["empty"])
        empty.preferredFilename = "image.png"
        #expect(decoded.keyForChildFileWrapper(empty) == "2__#$!@%!#__image.png")
    }

    @Test("SR-3: without a stored preferred name, a child's comes from its key; the root's stays nil")
    func preferredNameFromKey() throws {
        var e = HandEncoding()
        e.directory(childCount: 2)
        e.name("1__#$!@%!#__photo.jpg")
        e.file([1])
        e.name("plain")
        e.file([2])
        let decoded = try FileWrapper(validatingSerializedRepresentation: e.sealed())
        #expect(decoded.preferredFilename == nil)
        #expect(decoded.fileWrappers?["1__#$!@%!#__photo.jpg"]?.preferredFilename == "photo.jpg")
        #expect(decoded.fileWrappers?["plain"]?.preferredFilename == "plain")
    }

    @Test(
        "SR-1: the byte layout is the documented one, and a hand-made encoding re-encodes to the same bytes")
    func documentedLayout() throws {
        var e = HandEncoding()
        e.directory(permissions: 0o755, preferredName: "Doc", childCount: 3)
        e.name("a.txt")
        e.file(
            Array("hello".utf8), permissions: 0o640, preferredName: "a.txt",
            date: (978_307_200, 123_456_789), xattrs: [("user.a", [1, 2]), ("user.b", [])])
        e.name("link")
        e.link("../../x", preferredName: "link")
        e.name("z")
        e.directory(permissions: 0o700, preferredName: "z", date: (-2, 500_000_000), childCount: 0)
        let data = e.sealed()

        let decoded = try FileWrapper(validatingSerializedRepresentation: data)
        #expect(try decoded.serialized() == data)
        let a = try #require(decoded.fileWrappers?["a.txt"])
        #expect(a.regularFileContents == Data("hello".utf8))
        #expect(a.posixPermissions == 0o640)
        #expect(a.extendedAttributes == ["user.a": Data([1, 2]), "user.b": Data()])
        let date = try #require(a.modificationDate)
        // Near `Date`'s reference date a `Date` holds nanoseconds exactly, so they re-encode as is.
        #expect(abs(date.timeIntervalSinceReferenceDate - 0.123456789) < 1e-12)

        // The fixed parts, byte for byte: magic, version, root kind, flags, permissions.
        #expect(Array(data.prefix(14)) == Array("DOCFSFW".utf8) + [0, 1, 0, 2, 1, 0xED, 0x01])
    }

    @Test("SR-1: the encoding is deterministic: same tree, same bytes, whatever the insertion order")
    func deterministic() throws {
        let first = makeSampleTree(reversed: false)
        let second = makeSampleTree(reversed: true)
        let bytes = try first.serialized()
        #expect(try first.serialized() == bytes)
        #expect(try second.serialized() == bytes)
        #expect(try FileWrapper(validatingSerializedRepresentation: bytes).serialized() == bytes)
    }

    // MARK: Lazily read wrappers (SR-2)

    @Test("SR-2: a wrapper read lazily from disk serializes its contents, without keeping them")
    func lazyWrapper() throws {
        let scratch = try Scratch()
        let package = scratch.url.appendingPathComponent("Lazy.pkg")
        try FileManager.default.createDirectory(
            at: package.appendingPathComponent("inner"), withIntermediateDirectories: true)
        let big = patternBytes(2 << 20, seed: 7)
        try big.write(to: package.appendingPathComponent("big.bin"))
        try Data("note".utf8).write(to: package.appendingPathComponent("inner/note.txt"))
        try FileManager.default.createSymbolicLink(
            atPath: package.appendingPathComponent("link").path, withDestinationPath: "inner/note.txt")

        let lazy = try FileWrapper(url: package)
        let data = try lazy.serialized()
        let decoded = try FileWrapper(validatingSerializedRepresentation: data)
        #expect(decoded.preferredFilename == "Lazy.pkg")
        #expect(decoded.fileWrappers?["big.bin"]?.regularFileContents == big)
        #expect(
            decoded.fileWrappers?["inner"]?.fileWrappers?["note.txt"]?.regularFileContents
                == Data("note".utf8))
        #expect(try decoded.fileWrappers?["link"]?.symbolicLinkDestination() == "inner/note.txt")

        // The bytes were copied by range, not loaded into the lazy wrapper.
        let bigWrapper = try #require(lazy.fileWrappers?["big.bin"])
        let loaded = bigWrapper.state.withLock { s -> Data? in
            guard case .regular(let r) = s.storage else { return nil }
            return r.loaded
        }
        #expect(loaded == nil)
        #expect(differences(lazy, decoded).isEmpty, "\(differences(lazy, decoded))")  // this loads them
    }

    @Test("SR-2: serializedRepresentation is nil when a lazily read file cannot be loaded")
    func lazyFailure() throws {
        let scratch = try Scratch()
        let package = scratch.url.appendingPathComponent("Gone.pkg")
        try FileManager.default.createDirectory(at: package, withIntermediateDirectories: true)
        try Data("soon gone".utf8).write(to: package.appendingPathComponent("file.txt"))
        let lazy = try FileWrapper(url: package)
        _ = lazy.fileWrappers  // list the folder, but leave the file's bytes on disk
        try FileManager.default.removeItem(at: package.appendingPathComponent("file.txt"))

        #expect(lazy.serializedRepresentation == nil)
        #expect(throws: FileWrapperError.self) { try lazy.serialized() }
    }

    @Test("SR-3: names the format cannot hold are refused on encoding, so everything encoded decodes")
    func encodingRefusesInvalidTrees() throws {
        for bad in ["a/b", "..", "."] {
            let root = FileWrapper(directoryWithFileWrappers: [:])
            root.addRegularFile(withContents: Data(), preferredFilename: bad)
            #expect(root.serializedRepresentation == nil)
            #expect(throws: FileWrapperError.self) { try root.serialized() }
        }
        let link = FileWrapper(symbolicLinkWithDestination: "a\0b")
        #expect(
            throws: FileWrapperError.cannotSerialize(reason: "link destination \"a\\0b\" contains a NUL byte")
        ) {
            try link.serialized()
        }

        // Trees deeper than the format's limit are refused, not overflowed.
        let root = FileWrapper(directoryWithFileWrappers: [:])
        var parent = root
        for _ in 0...FileWrapper.maximumSerializationDepth {
            let child = FileWrapper(directoryWithFileWrappers: [:])
            child.preferredFilename = "d"
            parent.addFileWrapper(child)
            parent = child
        }
        #expect {
            try root.serialized()
        } throws: { error in
            guard case .cannotSerialize = error as? FileWrapperError else { return false }
            return true
        }
    }

    // MARK: Malformed input

    @Test("Every truncation of a valid encoding throws")
    func truncations() throws {
        let data = try smallTree().serialized()
        for length in 0..<data.count {
            let prefix = data.prefix(length)
            #expect(decodeError(prefix) != nil, "prefix of \(length) bytes")
            #expect(FileWrapper(serializedRepresentation: prefix) == nil)
        }
    }

    @Test("Every single-byte change throws (the CRC-32 catches all bursts up to 32 bits)")
    func byteFlips() throws {
        let data = try smallTree().serialized()
        var random = SplitMix64(seed: 42)
        for index in 0..<data.count {
            for mask in [0x01, 0x80, 0xFF, UInt8.random(in: 1...255, using: &random)] as [UInt8] {
                var flipped = data
                flipped[index] ^= mask
                #expect(decodeError(flipped) != nil, "byte \(index) ^ \(mask)")
            }
        }
        // Not just rejected, but for the right reason.
        var flipped = data
        flipped[20] ^= 0x10
        #expect(decodeError(flipped)?.reason.contains("checksum mismatch") == true)
    }

    @Test(
        "Random damage behind a valid checksum reaches the parser, which throws or decodes but never crashes")
    func fuzzBehindChecksum() throws {
        let body = Array(try smallTree().serialized().dropLast(4))
        var random = SplitMix64(seed: 2024)
        var decodedCount = 0
        for _ in 0..<3000 {
            var e = HandEncoding()
            e.bytes = body
            for _ in 0..<Int.random(in: 1...4, using: &random) {
                let index = Int.random(in: HandEncoding.headerSize..<e.bytes.count, using: &random)
                switch Int.random(in: 0..<4, using: &random) {
                case 0: e.bytes[index] = UInt8.random(in: 0...255, using: &random)
                case 1: e.bytes[index] = [0x00, 0xFF, 0x7F, 0x80].randomElement(using: &random) ?? 0
                case 2: e.bytes.remove(at: index)
                default: e.bytes.insert(UInt8.random(in: 0...255, using: &random), at: index)
                }
            }
            do {
                let decoded = try FileWrapper(validatingSerializedRepresentation: e.sealed())
                // Whatever decodes encodes again, and that decodes to the same tree.
                let again = try FileWrapper(validatingSerializedRepresentation: try decoded.serialized())
                #expect(differences(decoded, again).isEmpty)
                decodedCount += 1
            } catch is FileWrapperError {
                continue
            }
        }
        #expect(decodedCount < 3000)
    }

    @Test("Wrong magic, and data too short for a header, throw with the offset")
    func wrongMagic() throws {
        #expect(decodeError(Data())?.offset == 0)
        #expect(decodeError(Data("DOCF".utf8))?.reason.contains("truncated") == true)
        let png = Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 0])
        #expect(decodeError(png)?.offset == 0)
        var e = HandEncoding(magic: Array("DOCFSFX".utf8) + [0])
        e.file([])
        let failure = decodeError(e.sealed())
        #expect(failure?.offset == 6)
        #expect(failure?.reason.contains("magic") == true)
    }

    @Test("A future (or zero) format version throws unsupportedSerializationVersion")
    func unsupportedVersion() throws {
        for version: UInt16 in [0, 2, 0xFFFF] {
            var e = HandEncoding(version: version)
            e.file([1, 2, 3])
            #expect(throws: FileWrapperError.unsupportedSerializationVersion(version)) {
                try FileWrapper(validatingSerializedRepresentation: e.sealed())
            }
        }
    }

    @Test("Giant declared lengths and counts throw at once, before anything is allocated")
    func giantLengths() throws {
        var cases: [(String, HandEncoding, Int)] = []
        do {
            var e = HandEncoding()
            let at = e.count + 8
            e.directory(childCount: 0xFFFF_FFFF)
            cases.append(("children", e, at))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 1)
            let at = e.count
            e.u64(0xFFFF_FFFF_FFFF_FFFF)
            e.bytes += [1, 2, 3]
            cases.append(("file contents", e, at + 8))
        }
        do {
            var e = HandEncoding()
            e.u8(1)
            e.u8(0)
            e.u16(0o644)
            let at = e.count
            e.u32(0xFFFF_FFFF)
            e.u64(0)
            cases.append(("extended attributes", e, at))
        }
        do {
            var e = HandEncoding()
            e.u8(1)
            e.u8(0)
            e.u16(0o644)
            e.u32(1)
            e.name("user.big")
            let at = e.count + 4
            e.u32(0xFFFF_FFFF)
            e.u64(0)
            cases.append(("extended attribute value", e, at))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 3)
            let at = e.count + 4
            e.u32(0xFFFF_FFFF)
            cases.append(("link destination", e, at))
        }
        do {
            var e = HandEncoding()
            e.u8(1)
            e.u8(1)  // a preferred name follows
            e.u16(0o644)
            let at = e.count
            e.u16(0xFFFF)
            e.bytes += Array(repeating: 0x61, count: 300)
            cases.append(("longer than 255", e, at))
        }
        let clock = ContinuousClock()
        let elapsed = clock.measure {
            for (what, encoding, offset) in cases {
                let failure = decodeError(encoding.sealed())
                #expect(failure?.reason.contains(what) == true, "\(what): \(String(describing: failure))")
                #expect(failure?.offset == offset, "\(what)")
            }
        }
        #expect(elapsed < .seconds(1))
    }

    @Test("Nesting is limited to 256 levels below the root, so hostile depth cannot overflow the stack")
    func nestingLimit() throws {
        let limit = FileWrapper.maximumSerializationDepth
        #expect(limit == 256)
        var deepest = try FileWrapper(validatingSerializedRepresentation: nested(levels: limit).sealed())
        for _ in 0..<limit { deepest = try #require(deepest.fileWrappers?["d"]) }
        #expect(deepest.fileWrappers?.isEmpty == true)

        #expect(decodeError(nested(levels: limit + 1).sealed())?.reason.contains("deeper than 256") == true)
        #expect(decodeError(nested(levels: 100_000).sealed())?.reason.contains("deeper than 256") == true)
    }

    @Test("SR-3: hostile keys and preferred names throw at their offset")
    func hostileNames() throws {
        let hostile: [(String, [UInt8])] = [
            ("empty", []),
            ("relative path component", Array(".".utf8)),
            ("relative path component", Array("..".utf8)),
            ("slash", Array("a/b".utf8)),
            ("slash", Array("/".utf8)),
            ("NUL", Array("a\0b".utf8)),
            ("longer than 255", Array(repeating: 0x78, count: 256)),
            ("not valid UTF-8", [0xFF]),
            ("not valid UTF-8", [0x61, 0xC0, 0xAF]),  // an overlong "/"
            ("not valid UTF-8", [0xED, 0xA0, 0x80]),  // a UTF-16 surrogate
            ("not valid UTF-8", [0x61, 0xE2, 0x82]),  // cut in the middle of a character
        ]
        for (why, name) in hostile {
            // As a key.
            var key = HandEncoding()
            key.directory(childCount: 1)
            let keyOffset = key.count
            key.name(name)
            key.file([])
            let keyFailure = decodeError(key.sealed())
            #expect(
                keyFailure?.reason.contains(why) == true, "key \(name): \(String(describing: keyFailure))")
            #expect(keyFailure?.offset == keyOffset)

            // As the root's preferred name and as a child's.
            var root = HandEncoding()
            root.header(kind: 1, rawPreferredName: name)
            root.u64(0)
            let rootFailure = decodeError(root.sealed())
            #expect(rootFailure?.reason.contains(why) == true, "root name \(name)")
            #expect(rootFailure?.offset == HandEncoding.headerSize + 4)

            var child = HandEncoding()
            child.directory(childCount: 1)
            child.name("ok")
            let childNameOffset = child.count + 4
            child.header(kind: 1, rawPreferredName: name)
            child.u64(0)
            let childFailure = decodeError(child.sealed())
            #expect(childFailure?.reason.contains(why) == true, "child name \(name)")
            #expect(childFailure?.offset == childNameOffset)
        }

        // SR-3: a valid key whose derived preferred name is not.
        var derived = HandEncoding()
        derived.directory(childCount: 1)
        derived.name("1__#$!@%!#__..")
        derived.file([])
        #expect(decodeError(derived.sealed())?.reason.contains("derived") == true)
    }

    @Test("Duplicate keys throw, including canonically equivalent ones, which Swift keys treat as equal")
    func duplicateKeys() throws {
        for (first, second) in [("a", "a"), ("caf\u{E9}", "cafe\u{301}")] {
            var e = HandEncoding()
            e.directory(childCount: 2)
            e.name(first)
            e.file([1])
            let offset = e.count
            e.name(second)
            e.file([2])
            let failure = decodeError(e.sealed())
            #expect(failure?.reason.contains("duplicate key") == true)
            #expect(failure?.offset == offset)
        }
    }

    @Test("Unknown kinds and flags, bad permissions, dates, xattrs, link bytes and trailing bytes throw")
    func invalidFields() throws {
        var cases: [(String, HandEncoding)] = []
        for kind: UInt8 in [0, 5, 0xFF] {
            var e = HandEncoding()
            e.u8(kind)
            e.bytes += Array(repeating: 0, count: 15)
            cases.append(("unknown node kind", e))
        }
        do {
            var e = HandEncoding()
            e.u8(1)
            e.u8(0x04)
            e.bytes += Array(repeating: 0, count: 14)
            cases.append(("unknown node flags", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 1, permissions: 0o10000)
            e.u64(0)
            cases.append(("exceed 0o7777", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 1, date: (0, 1_000_000_000))
            e.u64(0)
            cases.append(("nanoseconds", e))
        }
        // The last case is in range but rounds up, as a `Date`, to a second the encoder refuses.
        for (seconds, nanoseconds): (Int64, UInt32) in [
            (.min, 0), (.max, 0), (-(1 << 53) - 1, 0), ((1 << 53) + 1, 0), (1 << 53, 999_999_999),
        ] {
            var e = HandEncoding()
            e.header(kind: 1, date: (seconds, nanoseconds))
            e.u64(0)
            cases.append(("beyond ±2^53", e))
        }
        for seconds: Int64 in [1 << 53, -(1 << 53)] {
            var e = HandEncoding()
            e.header(kind: 1, date: (seconds, 0))
            e.u64(0)
            let decoded = try FileWrapper(validatingSerializedRepresentation: e.sealed())
            #expect(try decoded.serialized() == e.sealed())
        }
        for (name, why) in [
            ("trusted.x", "user. namespace"), ("security.selinux", "user. namespace"),
            ("user.", "nothing after"),
            ("user.a\0b", "NUL"),
        ] {
            var e = HandEncoding()
            e.header(kind: 1, xattrs: [(name, [1])])
            e.u64(0)
            cases.append((why, e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 1, xattrs: [("user.a", [1]), ("user.a", [2])])
            e.u64(0)
            cases.append(("duplicate extended attribute", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 3)
            e.u32(3)
            e.bytes += [0x61, 0, 0x62]
            cases.append(("link destination contains a NUL", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 3)
            e.u32(2)
            e.bytes += [0xC3, 0x28]
            cases.append(("link destination is not valid UTF-8", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 4)
            e.u8(9)
            e.u64(0)
            cases.append(("unknown special file kind", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 4)
            e.u8(1)
            e.u64(7)
            cases.append(("a device number on a fifo or socket", e))
        }
        do {
            var e = HandEncoding()
            e.file([1, 2, 3])
            e.bytes += [0]
            cases.append(("1 trailing bytes", e))
        }
        do {
            var e = HandEncoding()
            e.header(kind: 1)
            e.u64(10)
            e.bytes += [1, 2, 3]
            cases.append(("runs past the end", e))
        }
        for (why, encoding) in cases {
            let failure = decodeError(encoding.sealed())
            #expect(failure?.reason.contains(why) == true, "\(why): \(String(describing: failure))")
        }
    }

    // MARK: Writing a decoded tree

    @Test("A decoded link to ../../outside is written as that link only; nothing lands outside the target")
    func decodedLinksStayInside() throws {
        var e = HandEncoding()
        e.directory(childCount: 3)
        e.name("deeper")
        e.directory(childCount: 1)
        e.name("up")
        e.link("../../../../x")
        e.name("escape")
        e.link("../../outside")
        e.name("file")
        e.file(Array("inside".utf8))
        let decoded = try FileWrapper(validatingSerializedRepresentation: e.sealed())

        for options: FileWrapper.WritingOptions in [[], .atomic] {
            let scratch = try Scratch()
            let base = scratch.url
            try FileManager.default.createDirectory(
                at: base.appendingPathComponent("a"), withIntermediateDirectories: true)
            let target = base.appendingPathComponent("a/pkg")
            try decoded.write(to: target, options: options, originalContentsURL: nil)

            #expect(try entries(base) == ["a"])
            #expect(try entries(base.appendingPathComponent("a")) == ["pkg"])
            #expect(try entries(target) == ["deeper", "escape", "file"])
            #expect(try entries(target.appendingPathComponent("deeper")) == ["up"])
            #expect(
                try FileManager.default.destinationOfSymbolicLink(
                    atPath: target.appendingPathComponent("escape").path)
                    == "../../outside")
            #expect(!FileManager.default.fileExists(atPath: base.appendingPathComponent("outside").path))
            // Writing again over the links, without .atomic, fails instead of following them.
            #expect(throws: (any Error).self) {
                try decoded.write(to: target, options: [], originalContentsURL: nil)
            }
            #expect(try entries(base) == ["a"])
        }
    }

    @Test(
        "Keys such as .. or a/b never reach the writer from a decoded tree, and the writer refuses them too")
    func hostileKeysAreNotWritten() throws {
        for key in ["..", "a/b"] {
            var e = HandEncoding()
            e.directory(childCount: 1)
            e.name(key)
            e.file(Array("escaped".utf8))
            #expect(FileWrapper(serializedRepresentation: e.sealed()) == nil)

            // Built in memory instead, where the preferred-name setter allows it.
            let scratch = try Scratch()
            let root = FileWrapper(directoryWithFileWrappers: [:])
            root.addRegularFile(withContents: Data("escaped".utf8), preferredFilename: key)
            #expect(root.keyForChildFileWrapper(try #require(root.fileWrappers?[key])) == key)
            let target = scratch.url.appendingPathComponent("pkg")
            #expect(throws: FileWrapperError.self) {
                try root.write(to: target, options: [], originalContentsURL: nil)
            }
            #expect(try entries(scratch.url).isEmpty)
        }
    }

    @Test("The test's bit-by-bit CRC-32 gives the standard check value, and the engine agrees with it")
    func checksum() throws {
        #expect(referenceCRC32(Array("123456789".utf8)) == 0xCBF4_3926)
        let data = try smallTree().serialized()
        let trailer = data.suffix(4).reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        #expect(trailer == referenceCRC32(Array(data.dropLast(4))))
    }

    // MARK: Helpers

    /// A small tree for the exhaustive truncation and bit-flip tests.
    func smallTree() -> FileWrapper {
        let root = FileWrapper(directoryWithFileWrappers: [:])
        let file = FileWrapper(regularFileWithContents: Data("abc".utf8))
        file.fileAttributes = [
            .type: FileAttributeType.typeRegular, .posixPermissions: 0o644,
            .modificationDate: Date(timeIntervalSince1970: 1_600_000_000.5),
            .extendedAttributes: ["user.k": Data("v".utf8)],
        ]
        file.preferredFilename = "f.txt"
        root.addFileWrapper(file)
        let link = FileWrapper(symbolicLinkWithDestination: "f.txt")
        link.preferredFilename = "l"
        root.addFileWrapper(link)
        let sub = FileWrapper(directoryWithFileWrappers: [:])
        sub.preferredFilename = "d"
        root.addFileWrapper(sub)
        return root
    }

    /// The round-trip tree. `reversed` inserts children and attributes in the opposite order,
    /// which must not change the encoding.
    func makeSampleTree(reversed: Bool = false) -> FileWrapper {
        func ordered<T>(_ items: [T]) -> [T] { reversed ? items.reversed() : items }
        let root = FileWrapper(directoryWithFileWrappers: [:])
        root.preferredFilename = "Notes.pkg"

        let empty = FileWrapper(regularFileWithContents: Data())
        empty.fileAttributes = [
            .type: FileAttributeType.typeRegular, .posixPermissions: 0o600,
            .modificationDate: Date(timeIntervalSince1970: -1.5),
        ]
        empty.preferredFilename = "empty"
        let big = FileWrapper(regularFileWithContents: patternBytes(3 << 20, seed: 1))
        big.fileAttributes = [
            .type: FileAttributeType.typeRegular, .posixPermissions: 0o4755,
            .modificationDate: Date(timeIntervalSince1970: 1_700_000_000.123456789),
        ]
        big.preferredFilename = "big.bin"
        // Two children want "image.png": the second is uniqued (FW-12). Which one gets the plain
        // key depends on insertion order, so the contents are the same to keep the tree the same.
        let images = (0..<2).map { _ in
            let image = FileWrapper(regularFileWithContents: Data("PNG".utf8))
            image.fileAttributes = [
                .type: FileAttributeType.typeRegular, .posixPermissions: 0o644,
                .modificationDate: Date(timeIntervalSince1970: 1_000_000_000),
            ]
            image.preferredFilename = "image.png"
            return image
        }
        let relative = FileWrapper(symbolicLinkWithDestinationURL: URL(fileURLWithPath: "sub/deeper/note.md"))
        relative.preferredFilename = "rel"
        let absolute = FileWrapper(symbolicLinkWithDestination: "/etc/hostname")
        absolute.preferredFilename = "abs"

        let note = FileWrapper(regularFileWithContents: Data("# Note\n".utf8))
        note.fileAttributes = [
            .type: FileAttributeType.typeRegular, .posixPermissions: 0o640,
            .modificationDate: Date(timeIntervalSince1970: 1_234_567_890.000000001),
        ]
        var xattrs: [String: Data] = [:]
        for (name, value) in ordered([("user.tag", Data("red".utf8)), ("user.empty", Data())]) {
            xattrs[name] = value
        }
        note.extendedAttributes = xattrs
        note.preferredFilename = "note.md"
        let deeper = FileWrapper(directoryWithFileWrappers: ["note.md": note])
        deeper.preferredFilename = "deeper"
        let sub = FileWrapper(directoryWithFileWrappers: [:])
        sub.preferredFilename = "sub"
        sub.addFileWrapper(deeper)
        // After the children: adding one clears a folder's date (FW-19).
        sub.fileAttributes = [
            .type: FileAttributeType.typeDirectory, .posixPermissions: 0o750,
            .modificationDate: Date(timeIntervalSince1970: 1_650_000_000.987654321),
        ]

        for child in ordered([empty, big, images[0], images[1], relative, absolute, sub]) {
            root.addFileWrapper(child)
        }
        return root
    }

    /// A chain of `levels` folders named "d" below the root, the last one empty.
    private func nested(levels: Int) -> HandEncoding {
        var e = HandEncoding()
        e.bytes.reserveCapacity(levels * 15 + 32)
        for _ in 0..<levels {
            e.directory(childCount: 1)
            e.name("d")
        }
        e.directory(childCount: 0)
        return e
    }
}

// MARK: - Test support

/// The reason and offset of a corrupt-representation error, or nil (recording an issue) if the
/// data decodes or fails in another way. Also checks that the failable initializer returns nil.
private func decodeError(
    _ data: Data, sourceLocation: SourceLocation = #_sourceLocation
) -> (reason: String, offset: Int)? {
    #expect(FileWrapper(serializedRepresentation: data) == nil, sourceLocation: sourceLocation)
    do {
        _ = try FileWrapper(validatingSerializedRepresentation: data)
        Issue.record("malformed data was decoded", sourceLocation: sourceLocation)
    } catch FileWrapperError.corruptSerializedRepresentation(let reason, let offset) {
        #expect(offset >= 0 && offset <= data.count, sourceLocation: sourceLocation)
        return (reason, offset)
    } catch FileWrapperError.unsupportedSerializationVersion(let version) {
        return ("unsupported version \(version)", 8)
    } catch {
        Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

/// Every way two trees differ, as paths and descriptions; empty if they are the same.
private func differences(_ a: FileWrapper, _ b: FileWrapper, at path: String = "/") -> [String] {
    var result: [String] = []
    func check<T: Equatable>(_ what: String, _ x: T, _ y: T) {
        if x != y { result.append("\(path) \(what): \(x) ≠ \(y)") }
    }
    check("kind", a.kind, b.kind)
    check("preferred name", a.preferredFilename, b.preferredFilename)
    check("permissions", String(a.posixPermissions, radix: 8), String(b.posixPermissions, radix: 8))
    check("modification date", a.modificationDate, b.modificationDate)
    check("xattrs", a.extendedAttributes, b.extendedAttributes)
    guard a.kind == b.kind else { return result }
    switch a.kind {
    case .fifo, .socket, .characterDevice, .blockDevice:
        check("device", a.deviceIdentifier, b.deviceIdentifier)
    case .regularFile:
        check("contents", a.regularFileContents, b.regularFileContents)
    case .symbolicLink:
        check("destination", try? a.symbolicLinkDestination(), try? b.symbolicLinkDestination())
    case .directory:
        let x = a.fileWrappers ?? [:]
        let y = b.fileWrappers ?? [:]
        check("keys", x.keys.sorted(), y.keys.sorted())
        for (key, child) in x {
            if let other = y[key] { result += differences(child, other, at: path + key + "/") }
        }
    }
    return result
}

/// Writes the format by hand, including data the encoder would never produce; `sealed()` adds
/// a correct checksum, so that the check under test, not the checksum, is what rejects it.
private struct HandEncoding {
    static let headerSize = 10
    var bytes: [UInt8]

    init(magic: [UInt8] = Array("DOCFSFW".utf8) + [0], version: UInt16 = 1) {
        bytes = magic
        u16(version)
    }

    var count: Int { bytes.count }

    mutating func integer<T: FixedWidthInteger>(_ value: T) {
        withUnsafeBytes(of: value.littleEndian) { bytes += $0 }
    }
    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func u16(_ value: UInt16) { integer(value) }
    mutating func u32(_ value: UInt32) { integer(value) }
    mutating func u64(_ value: UInt64) { integer(value) }

    mutating func name(_ raw: [UInt8]) {
        u16(UInt16(raw.count))
        bytes += raw
    }
    mutating func name(_ name: String) { self.name(Array(name.utf8)) }

    /// Kind, flags, permissions, preferred name, date and extended attributes of a node.
    mutating func header(
        kind: UInt8, permissions: UInt16 = 0o644, preferredName: String? = nil,
        rawPreferredName: [UInt8]? = nil,
        date: (Int64, UInt32)? = nil, xattrs: [(String, [UInt8])] = []
    ) {
        let nameBytes = rawPreferredName ?? preferredName.map { Array($0.utf8) }
        u8(kind)
        u8((nameBytes == nil ? 0 : 1) | (date == nil ? 0 : 2))
        u16(permissions)
        if let nameBytes { name(nameBytes) }
        if let date {
            u64(UInt64(bitPattern: date.0))
            u32(date.1)
        }
        u32(UInt32(xattrs.count))
        for (xattr, value) in xattrs {
            name(xattr)
            u32(UInt32(value.count))
            bytes += value
        }
    }

    mutating func file(
        _ contents: [UInt8], permissions: UInt16 = 0o644, preferredName: String? = nil,
        date: (Int64, UInt32)? = nil, xattrs: [(String, [UInt8])] = []
    ) {
        header(kind: 1, permissions: permissions, preferredName: preferredName, date: date, xattrs: xattrs)
        u64(UInt64(contents.count))
        bytes += contents
    }

    /// A folder's node up to its child count; the caller appends the children.
    mutating func directory(
        permissions: UInt16 = 0o755, preferredName: String? = nil, date: (Int64, UInt32)? = nil,
        childCount: UInt32
    ) {
        header(kind: 2, permissions: permissions, preferredName: preferredName, date: date)
        u32(childCount)
    }

    mutating func link(_ destination: String, preferredName: String? = nil) {
        header(kind: 3, permissions: 0o666, preferredName: preferredName)
        u32(UInt32(destination.utf8.count))
        bytes += Array(destination.utf8)
    }

    /// The bytes with their CRC-32 appended.
    func sealed() -> Data {
        var copy = self
        copy.integer(referenceCRC32(bytes))
        return Data(copy.bytes)
    }
}

/// CRC-32 (IEEE), bit by bit: an independent check of the table-driven one in the engine.
private func referenceCRC32(_ bytes: [UInt8]) -> UInt32 {
    var crc: UInt32 = 0xFFFF_FFFF
    for byte in bytes {
        crc ^= UInt32(byte)
        for _ in 0..<8 { crc = (crc >> 1) ^ (crc & 1 == 0 ? 0 : 0xEDB8_8320) }
    }
    return ~crc
}

/// A folder under the temporary directory, named by a UUID and removed on deinit.
private final class Scratch {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory.appendingPathComponent(
            "docfs-serialization-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }
}

private func entries(_ url: URL) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: url.path).sorted()
}

/// Deterministic bytes that differ from run to run of `seed` only.
private func patternBytes(_ count: Int, seed: UInt64) -> Data {
    var generator = SplitMix64(seed: seed)
    var data = Data(count: count)
    data.withUnsafeMutableBytes { (raw: UnsafeMutableRawBufferPointer) in
        var i = 0
        while i < count {
            var word = generator.next()
            for _ in 0..<min(8, count - i) {
                raw[i] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                i += 1
            }
        }
    }
    return data
}

