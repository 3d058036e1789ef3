import DocumentEngine
import Foundation
import Testing

#if canImport(Glibc)
    import Glibc
#endif

private struct Entry: Codable, Equatable, Sendable {
    var name: String
    /// Encoding an entry with `poison` set fails, to prove a failed save leaves the old file.
    var poison = false

    init(_ name: String, poison: Bool = false) {
        self.name = name
        self.poison = poison
    }

    private enum CodingKeys: String, CodingKey { case name }

    init(from decoder: any Decoder) throws {
        name = try decoder.container(keyedBy: CodingKeys.self).decode(String.self, forKey: .name)
    }

    func encode(to encoder: any Encoder) throws {
        if poison {
            throw EncodingError.invalidValue(self, .init(codingPath: [], debugDescription: "poison"))
        }
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(name, forKey: .name)
    }
}

// Serialized: flushAll() reaches every live instance, and would race the write counts of others.
@Suite(.serialized) struct AutosavedValueTests {
    let tmp: TemporaryDirectory

    init() throws {
        tmp = try TemporaryDirectory()
    }

    func plist<T: Decodable>(_ type: T.Type, at url: URL) throws -> T {
        try PropertyListDecoder().decode(type, from: Data(contentsOf: url))
    }

    func writePlist<T: Encodable>(_ value: T, to url: URL) throws {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .binary
        try encoder.encode(value).write(to: url)
    }

    func folderContents() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: tmp.path).sorted()
    }

    @Test("Loads lazily: the file is first read on first access")
    func lazyLoad() throws {
        let url = tmp.url("history.plist")
        let history = AutosavedValue<[String]>(fileURL: url, default: [])
        try writePlist(["written after init"], to: url)
        #expect(history.value == ["written after init"])
        // Read once: later changes on disk are not picked up.
        try writePlist(["later"], to: url)
        #expect(history.value == ["written after init"])
    }

    @Test("A missing file gives the default value, and reading creates nothing")
    func missingFile() throws {
        let url = tmp.url("sub/missing.plist")
        let value = AutosavedValue(fileURL: url, default: ["default"])
        #expect(value.value == ["default"])
        #expect(try value.load() == ["default"])
        #expect(!FileManager.default.fileExists(atPath: url.path))
        #expect(value.writeCount == 0)
    }

    @Test("Immediate saving: every change is written in the call, as a binary plist with mode 0600")
    func immediateSave() throws {
        let url = tmp.url("sub/dir/items.plist")
        let items = AutosavedValue<[String]>(fileURL: url, default: [])
        items.value.append("one")
        #expect(try plist([String].self, at: url) == ["one"])
        items.modify { $0.append("two") }
        #expect(try plist([String].self, at: url) == ["one", "two"])
        #expect(items.writeCount == 2)
        #expect(!items.hasUnsavedChanges)

        let data = try Data(contentsOf: url)
        #expect(data.starts(with: Data("bplist00".utf8)))
        var st = stat()
        #expect(stat(url.path, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        // No temporary file is left behind.
        #expect(try FileManager.default.contentsOfDirectory(atPath: tmp.path("sub/dir")) == ["items.plist"])
    }

    @Test("Coalesced saving: a burst of changes within the delay costs one write")
    func coalescedSave() throws {
        let url = tmp.url("coalesced.plist")
        let clock = ManualAutosaveScheduler()
        let items = AutosavedValue<[Int]>(
            fileURL: url, default: [], savePolicy: .coalesced(after: .seconds(2)), scheduler: clock)
        for i in 0..<50 { items.value.append(i) }
        #expect(items.writeCount == 0)
        #expect(items.hasUnsavedChanges)
        #expect(clock.pendingCount == 1)
        #expect(!FileManager.default.fileExists(atPath: url.path))

        clock.advance(by: .milliseconds(1999))
        #expect(items.writeCount == 0)
        clock.advance(by: .milliseconds(1))
        #expect(items.writeCount == 1)
        #expect(try plist([Int].self, at: url) == Array(0..<50))
        #expect(!items.hasUnsavedChanges)

        // The next change starts a new delay.
        items.value.append(50)
        #expect(clock.pendingCount == 1)
        clock.advance(by: .seconds(5))
        #expect(items.writeCount == 2)
        #expect(try plist([Int].self, at: url).last == 50)
    }

    @Test("flush() writes pending changes now; the scheduled save then has nothing to do")
    func flush() throws {
        let url = tmp.url("flush.plist")
        let clock = ManualAutosaveScheduler()
        let items = AutosavedValue<[String]>(
            fileURL: url, default: [], savePolicy: .coalesced(after: .seconds(1)), scheduler: clock)
        items.value = ["a", "b"]
        try items.flush()
        #expect(items.writeCount == 1)
        #expect(try plist([String].self, at: url) == ["a", "b"])
        clock.advance(by: .seconds(1))
        #expect(items.writeCount == 1)
        try items.flush()
        #expect(items.writeCount == 1)
    }

    @Test("flushAll() saves every live instance; deinit saves pending changes")
    func flushAllAndDeinit() throws {
        let clock = ManualAutosaveScheduler()
        let first = AutosavedValue<[String]>(
            fileURL: tmp.url("first.plist"), default: [], savePolicy: .coalesced(after: .seconds(60)),
            scheduler: clock)
        let second = AutosavedValue<[String: Int]>(
            fileURL: tmp.url("second.plist"), default: [:], savePolicy: .coalesced(after: .seconds(60)),
            scheduler: clock)
        first.value = ["x"]
        second.value = ["y": 1]
        AutosavedValue.flushAll()
        #expect(first.writeCount == 1 && second.writeCount == 1)
        #expect(try plist([String].self, at: tmp.url("first.plist")) == ["x"])
        #expect(try plist([String: Int].self, at: tmp.url("second.plist")) == ["y": 1])

        do {
            let third = AutosavedValue<[String]>(
                fileURL: tmp.url("third.plist"), default: [], savePolicy: .coalesced(after: .seconds(60)),
                scheduler: clock)
            third.value = ["z"]
        }
        #expect(try plist([String].self, at: tmp.url("third.plist")) == ["z"])
    }

    @Test("A corrupt file is kept aside, load() throws once, value falls back to the default")
    func corruptFile() throws {
        let url = tmp.url("corrupt.plist")
        try Data("not a property list".utf8).write(to: url)
        let items = AutosavedValue<[String]>(fileURL: url, default: ["default"])
        let error = #expect(throws: AutosavedValueError.self) { try items.load() }
        guard case .corruptFile(let file, let preserved?, _)? = error else {
            Issue.record("expected corruptFile with a preserved copy, got \(String(describing: error))")
            return
        }
        #expect(file.lastPathComponent == "corrupt.plist")
        #expect(preserved.lastPathComponent.hasPrefix("corrupt.plist.corrupt-"))
        #expect(try Data(contentsOf: preserved) == Data("not a property list".utf8))
        #expect(try items.load() == ["default"])

        items.value.append("new")
        #expect(try plist([String].self, at: url) == ["default", "new"])
        #expect(try Data(contentsOf: preserved) == Data("not a property list".utf8))

        // The non-throwing accessor: default value, file set aside too.
        try Data("garbage".utf8).write(to: url)
        let other = AutosavedValue<[String]>(fileURL: url, default: [])
        #expect(other.value == [])
        #expect(try folderContents().filter { $0.contains(".corrupt-") }.count == 2)
    }

    @Test("Atomicity: a save that fails leaves the previous complete file in place")
    func failedSaveKeepsOldFile() throws {
        let url = tmp.url("entries.plist")
        let entries = AutosavedValue<[Entry]>(fileURL: url, default: [])
        entries.value = [Entry("good")]
        let before = try Data(contentsOf: url)

        entries.value.append(Entry("bad", poison: true))
        #expect(try Data(contentsOf: url) == before)
        #expect(try plist([Entry].self, at: url) == [Entry("good")])
        #expect(entries.hasUnsavedChanges)
        guard case .encodingFailed? = entries.lastSaveError as? AutosavedValueError else {
            Issue.record("expected encodingFailed, got \(String(describing: entries.lastSaveError))")
            return
        }
        #expect(throws: AutosavedValueError.self) { try entries.flush() }
        #expect(try folderContents() == ["entries.plist"])

        entries.modify { $0[1].poison = false }
        #expect(try plist([Entry].self, at: url) == [Entry("good"), Entry("bad")])
        #expect(entries.lastSaveError == nil)
    }

    @Test("The property wrapper stores through an AutosavedValue")
    func propertyWrapper() throws {
        let url = tmp.url("wrapped.plist")
        @Autosaved(file: url) var items: [String] = ["seed"]
        #expect(items == ["seed"])
        items.append("more")
        #expect($items.writeCount == 1)
        #expect(try plist([String].self, at: url) == ["seed", "more"])
        #expect(AutosavedValue<[String]>(fileURL: url, default: []).value == ["seed", "more"])
    }

    @Test("The default location is the application-support folder (SB-1); JSON is optional")
    func defaultLocationAndJSON() throws {
        let appID = "autosaved-test-\(UInt32.random(in: 0...UInt32.max))"
        let value = AutosavedValue(
            fileName: "count.json", appID: appID, default: 0, format: .json)
        #expect(
            value.fileURL == SearchPaths(appID: appID).applicationSupport.appendingPathComponent("count.json")
        )

        let direct = AutosavedValue(fileURL: tmp.url("count.json"), default: 0, format: .json)
        direct.value = 42
        #expect(try String(contentsOf: tmp.url("count.json"), encoding: .utf8) == "42")
        #expect(AutosavedValue(fileURL: tmp.url("count.json"), default: 0, format: .json).value == 42)
    }

    @Test("Exit handlers: SIGTERM saves pending changes and exits with 128 + signal; so does exit()")
    func exitHandlers() async throws {
        let onSignal = tmp.path("signal.plist")
        await #expect(processExitsWith: .exitCode(128 + SIGTERM)) { [onSignal = onSignal as String] in
            AutosavedValue.installExitHandlers()
            let value = AutosavedValue<[String]>(
                fileURL: URL(fileURLWithPath: onSignal), default: [],
                savePolicy: .coalesced(after: .seconds(3600)))
            value.value = ["saved on SIGTERM"]
            kill(getpid(), SIGTERM)
            // A signal lost between the install and the kill fails the test instead of hanging it.
            _ = withExtendedLifetime(value) { sleep(20) }
            exit(3)
        }
        #expect(try plist([String].self, at: URL(fileURLWithPath: onSignal)) == ["saved on SIGTERM"])

        let atExit = tmp.path("atexit.plist")
        await #expect(processExitsWith: .exitCode(0)) { [atExit = atExit as String] in
            AutosavedValue.installExitHandlers()
            let value = AutosavedValue<[String]>(
                fileURL: URL(fileURLWithPath: atExit), default: [],
                savePolicy: .coalesced(after: .seconds(3600)))
            value.value = ["saved at exit"]
            withExtendedLifetime(value) { exit(0) }
        }
        #expect(try plist([String].self, at: URL(fileURLWithPath: atExit)) == ["saved at exit"])
    }
}
