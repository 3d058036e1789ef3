import DocumentEngine
import SQLiteStore
import Foundation
import SampleDocuments
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A file's inode number, or 0 if it cannot be read.
func inode(_ path: String) -> UInt64 {
    var st = stat()
    return lstat(path, &st) == 0 ? UInt64(st.st_ino) : 0
}

@MainActor
final class NotesDelegate: ImageNotesDocumentDelegate {
    var updates = 0
    func noteDocumentContentsUpdated(_ document: ImageNotesDocument) { updates += 1 }
}

/// The seeds' document types on disk and in a store.
@MainActor
@Suite struct SampleDocumentsTests {
    let directory: URL

    init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "docfs-samples-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    }

    @Test("MyStuff: things.data plus a uniquely keyed image per item; reopening restores both")
    func things() async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("Things I Own.mystuff")
        let doc = ThingsDocument(fileURL: url)
        let bike = doc.addThing(named: "Bicycle", location: "Garage")
        let lamp = doc.addThing(named: "Lamp", location: "Desk")
        doc.setImage(PNG.sample(seed: 1), for: bike)
        doc.setImage(PNG.sample(seed: 2), for: lamp)
        #expect(bike.imageKey == "image.png" && lamp.imageKey == "1__#$!@%!#__image.png")  // FW-12
        #expect(await doc.save(to: url, for: .forCreating))
        await doc.close()
        let files = try FileManager.default.contentsOfDirectory(atPath: url.path).sorted()
        #expect(files == ["1__#$!@%!#__image.png", "image.png", "things.data"])

        let reopened = ThingsDocument(fileURL: url)
        #expect(await reopened.open())
        #expect(reopened.things.map(\.name) == ["Bicycle", "Lamp"])
        #expect(reopened.things.map(\.location) == ["Garage", "Desk"])
        #expect(reopened.image(for: reopened.things[1]) == PNG.sample(seed: 2))

        // A save while the other picture was never read: it is hard-linked, and must still be
        // readable afterwards (its lazy source follows the package, not the scratch folder).
        let bikeInode = inode(url.appendingPathComponent("image.png").path)
        reopened.setImage(PNG.sample(seed: 9), for: reopened.things[1])
        #expect(await reopened.save(to: url, for: .forOverwriting))
        #expect(inode(url.appendingPathComponent("image.png").path) == bikeInode)
        #expect(reopened.image(for: reopened.things[0]) == PNG.sample(seed: 1))
        #expect(reopened.image(for: reopened.things[1]) == PNG.sample(seed: 9))
        await reopened.close()
    }

    @Test("MyStuff in a store: opening reads no image; a new picture writes only that image")
    func thingsInStore() async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteStore(
            path: directory.appendingPathComponent("S.docstore").path, options: .create)
        try await DemoDocuments.populate(store)
        let info = try #require(try store.document(named: "Things I Own.mystuff"))
        let images = try store.nodes(of: info.id).filter { $0.name.hasSuffix("image.png") }
        #expect(images.count == 4)
        let imageBytes = images.reduce(Int64(0)) { $0 + $1.size }

        let fresh = try SQLiteStore(path: store.path)
        let doc = ThingsDocument(store: fresh, name: "Things I Own.mystuff")
        #expect(await doc.open())
        #expect(doc.things.map(\.name) == ["Bicycle", "Guitar", "Telescope", "Kayak"])
        #expect(fresh.statistics.bytesRead < imageBytes / 4)  // things.data only, no picture
        #expect(doc.image(for: doc.things[2]) == PNG.sample(seed: 2))

        let before = fresh.statistics.bytesWritten
        let newPicture = PNG.sample(seed: 42, size: 80)
        doc.setImage(newPicture, for: doc.things[0])
        #expect(await doc.save(to: doc.fileURL, for: .forOverwriting))
        let written = fresh.statistics.bytesWritten - before
        #expect(written >= Int64(newPicture.count) && written < Int64(newPicture.count) + 4096)  // + things.data
        await doc.close()
        #expect(try store.checkIntegrity().isClean)
    }

    @Test("ImageNotes: the delegate is told on open and on revert; text and image round-trip")
    func imageNotes() async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("Trip.imagenote")
        let doc = ImageNotesDocument(fileURL: url)
        doc.text = "tent"
        doc.image = PNG.sample(seed: 3)
        #expect(await doc.save(to: url, for: .forCreating))
        await doc.close()

        let delegate = NotesDelegate()
        let reopened = ImageNotesDocument(fileURL: url)
        reopened.delegate = delegate
        #expect(await reopened.open())
        #expect(delegate.updates == 1)
        #expect(reopened.text == "tent" && reopened.image == PNG.sample(seed: 3))
        #expect(!reopened.hasUnsavedChanges)
        reopened.text = "tent and stove"
        #expect(await reopened.revert(toContentsOf: url))
        #expect(delegate.updates == 2)
        #expect(reopened.text == "tent")
        await reopened.close()
    }

    @Test("The demo store holds the seeds' documents, and populating twice adds nothing")
    func demo() async throws {
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteStore(
            path: directory.appendingPathComponent("Demo.docstore").path, options: .create)
        try await DemoDocuments.populate(store)
        try await DemoDocuments.populate(store)
        #expect(try store.documents().map(\.name).sorted() == DemoDocuments.names.sorted())
        let text = PlainTextDocument(store: store, name: "Shopping List.txt")
        #expect(await text.open())
        #expect(text.text == "milk\neggs\nbread\n")
        await text.close()
        let png = PNG.sample(seed: 0)
        #expect(png.prefix(8) == Data([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A]))
    }
}
