import DocumentEngine
import Foundation
import SQLiteStore
import SampleDocuments
import Testing

// The examples of docs/library/getting-started.md (and of DocumentEngine.docc's article of the
// same name), as they are printed there: if the API changes under them, this file stops
// compiling or these tests fail, and the guide must change with it.

/// The guide's flat document: text, saved as UTF-8.
final class NoteDocument: Document {
    var text = ""

    override func contents(forType typeName: String) throws -> Any {
        Data(text.utf8)
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        text = String(decoding: contents as? Data ?? Data(), as: UTF8.self)
    }
}

/// The repository's root (this file is Tests/SampleDocumentsTests/GettingStartedTests.swift).
private let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
    .deletingLastPathComponent().deletingLastPathComponent()

@MainActor
@Suite("The getting-started guide's examples")
struct GettingStartedTests {
    @Test(
        "the guide's Swift examples are this file's code",
        arguments: [
            "docs/library/getting-started.md",
            "Sources/DocumentEngine/DocumentEngine.docc/GettingStarted.md",
        ])
    func examplesAreTested(_ guide: String) throws {
        let text = try String(contentsOf: repository.appendingPathComponent(guide), encoding: .utf8)
        let code = try String(contentsOf: URL(fileURLWithPath: #filePath), encoding: .utf8)
            .components(separatedBy: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        let blocks = text.components(separatedBy: "```swift\n").dropFirst().map {
            $0.components(separatedBy: "```").first ?? ""
        }
        #expect(blocks.count >= 4, "\(guide) has \(blocks.count) Swift examples")
        for block in blocks where !block.hasPrefix("// Package.swift") {
            // Every line of the example, in order, is a line of this file.
            var next = code.startIndex
            for line in block.components(separatedBy: "\n").map({ $0.trimmingCharacters(in: .whitespaces) })
            where !line.isEmpty {
                guard let found = code[next...].firstIndex(of: line) else {
                    Issue.record("\(guide): an example's line is not in GettingStartedTests.swift: \(line)")
                    break
                }
                next = code.index(after: found)
            }
        }
    }

    let folder: URL

    init() throws {
        folder = FileManager.default.temporaryDirectory.appendingPathComponent("docfs-guide-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
    }

    @Test("A package of file wrappers, saved incrementally")
    func fileWrappers() throws {
        defer { try? FileManager.default.removeItem(at: folder) }
        let url = folder.appendingPathComponent("Album.pkg")
        let archive = Data("archive".utf8)
        let png = Data("png".utf8)
        let newPNG = Data("new png".utf8)

        // -- guide: file wrappers
        let package = FileWrapper(directoryWithFileWrappers: [:])
        package.addRegularFile(withContents: archive, preferredFilename: "things.data")
        let key = package.addRegularFile(withContents: png, preferredFilename: "image.png")
        let second = package.addRegularFile(withContents: png, preferredFilename: "image.png")
        // second == "1__#$!@%!#__image.png": keys are unique within a folder.
        try package.write(to: url, options: [.atomic, .withNameUpdating])

        // Later: open lazily (names and attributes only), replace one image, save incrementally.
        let document = try FileWrapper(url: url)
        document.removeFileWrapper(document.fileWrappers![key]!)
        document.addRegularFile(withContents: newPNG, preferredFilename: "image.png")
        let report = try document.write(
            to: url, options: [.atomic, .withNameUpdating], originalContentsURL: url)
        // report.regularFilesWritten == 1: the unchanged files were hard-linked.
        // -- end

        #expect(second == "1__#$!@%!#__image.png")
        #expect(report.regularFilesWritten == 1 && report.regularFilesLinked == 2, "\(report)")
        let reread = try FileWrapper(url: url, options: .immediate)
        #expect(reread.fileWrappers?["image.png"]?.regularFileContents == newPNG)
    }

    @Test("A Document subclass: open, change, close")
    func document() async throws {
        defer { try? FileManager.default.removeItem(at: folder) }
        let url = folder.appendingPathComponent("Note.txt")
        try Data("first line\n".utf8).write(to: url)

        // -- guide: a document
        let note = NoteDocument(fileURL: url)
        if await note.open() {
            note.text += "one more line\n"
            note.updateChangeCount(.done)
        }
        await note.close()  // saves the unsaved change
        // -- end

        #expect(try String(contentsOf: url, encoding: .utf8) == "first line\none more line\n")
    }

    @Test("MyStuff: a package document in a folder and in a store")
    func myStuff() async throws {
        defer { try? FileManager.default.removeItem(at: folder) }
        let bicyclePNG = Data("bicycle".utf8)

        // -- guide: MyStuff on disk
        let url = folder.appendingPathComponent("Things I Own.mystuff")
        let things = ThingsDocument(fileURL: url)
        let bicycle = things.addThing(named: "Bicycle", location: "Garage")
        things.setImage(bicyclePNG, for: bicycle)
        guard await things.save(to: url, for: .forCreating) else { return }
        await things.close()
        // The package now holds things.data and image.png.
        // -- end

        // -- guide: MyStuff in a store
        let store = try SQLiteStore(
            path: folder.appendingPathComponent("Mine.docstore").path, options: .create)
        let stored = ThingsDocument(store: store, name: "Things I Own.mystuff")
        stored.addThing(named: "Guitar", location: "Living room")
        let storeURL = URL(fileURLWithPath: store.location).appendingPathComponent("Things I Own.mystuff")
        _ = await stored.save(to: storeURL, for: .forCreating)
        await stored.close()

        let reopened = ThingsDocument(store: store, name: "Things I Own.mystuff")
        if await reopened.open() {
            print(reopened.things.map(\.name))  // ["Guitar"]
        }
        let info = try store.document(named: "Things I Own.mystuff")!
        for version in try store.versions(of: info.id) {
            print(version.id, version.created, version.origin)
        }
        // -- end

        let files = try FileManager.default.contentsOfDirectory(atPath: url.path).sorted()
        #expect(files == ["image.png", "things.data"])
        #expect(reopened.things.map(\.name) == ["Guitar"])
        #expect(try store.versions(of: info.id).count >= 1)
        await reopened.close()
    }
}
