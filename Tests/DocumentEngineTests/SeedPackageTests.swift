import DocumentEngine
import Foundation
import Testing
import TestSupport

/// The seeds' packages: MyStuff (an archive plus one image per item) and ImageNotes
/// (Text.txt + Image.png), built and saved the way those apps do it.
@Suite struct SeedPackageTests {
    /// MyStuff's `contentsForType:`: a `things.data` archive and an image wrapper per item.
    func myStuffPackage(items: [(name: String, image: Data)]) throws -> (FileWrapper, [String]) {
        let package = FileWrapper(directoryWithFileWrappers: [:])
        var keys: [String] = []
        for item in items {
            keys.append(package.addRegularFile(withContents: item.image, preferredFilename: "image.png"))
        }
        let things = items.enumerated().map { ["name": $0.element.name, "imageKey": keys[$0.offset]] }
        let archive = try NSKeyedArchiver.archivedData(withRootObject: things, requiringSecureCoding: false)
        package.addRegularFile(withContents: archive, preferredFilename: "things.data")
        return (package, keys)
    }

    @Test("MyStuff: a second image.png gets a unique key (FW-12); replacing one image rewrites only it")
    func myStuff() throws {
        let tmp = try TemporaryDirectory()
        let items = (0..<3).map { (name: "Thing \($0)", image: sampleBytes(20_000, seed: UInt64($0))) }
        let (package, keys) = try myStuffPackage(items: items)
        #expect(keys == ["image.png", "1__#$!@%!#__image.png", "2__#$!@%!#__image.png"])
        let url = tmp.url("Things I Own.mystuff")
        try package.write(to: url, options: [.atomic, .withNameUpdating])
        #expect(try tmp.entries(url.lastPathComponent).count == 4)

        // Reopen, as the app does on launch, and read the archive back.
        let reopened = try FileWrapper(url: url)
        let archive = try #require(reopened.fileWrappers?["things.data"]?.regularFileContents)
        let things = try #require(
            try NSKeyedUnarchiver.unarchivedObject(
                ofClasses: [NSArray.self, NSDictionary.self, NSString.self], from: archive)
                as? [[String: String]])
        #expect(things.map { $0["name"] } == ["Thing 0", "Thing 1", "Thing 2"])
        #expect(reopened.fileWrappers?[things[1]["imageKey"] ?? ""]?.regularFileContents == items[1].image)

        // The user picks a new picture for item 1: remove its wrapper, add the new one.
        let before = try keys.map { try FileFacts(url.appendingPathComponent($0).path).inode }
        let oldImage = try #require(reopened.fileWrappers?[keys[1]])
        reopened.removeFileWrapper(oldImage)
        let newImage = sampleBytes(30_000, seed: 99)
        let newKey = reopened.addRegularFile(withContents: newImage, preferredFilename: "image.png")
        #expect(newKey == keys[1])  // the freed key is the smallest free one
        let report = try reopened.write(
            to: url, options: [.atomic, .withNameUpdating], originalContentsURL: url)
        #expect(report.regularFilesWritten == 1 && report.bytesWritten == Int64(newImage.count))
        let after = try keys.map { try FileFacts(url.appendingPathComponent($0).path).inode }
        #expect(after[0] == before[0] && after[2] == before[2] && after[1] != before[1])
    }

    @Test("ImageNotes: Text.txt and Image.png round-trip through a package")
    func imageNotes() throws {
        let tmp = try TemporaryDirectory()
        let text = "Remember the milk.\n"
        let image = sampleBytes(50_000, seed: 7)
        let package = FileWrapper(directoryWithFileWrappers: [
            "Text.txt": FileWrapper(regularFileWithContents: Data(text.utf8)),
            "Image.png": FileWrapper(regularFileWithContents: image),
        ])
        let url = tmp.url("Note.imagenote")
        try package.write(to: url, options: .atomic)
        let back = try FileWrapper(url: url)
        #expect(Set(back.fileWrappers?.keys ?? [:].keys) == ["Text.txt", "Image.png"])
        #expect(
            back.fileWrappers?["Text.txt"]?.regularFileContents.map { String(decoding: $0, as: UTF8.self) }
                == text)
        #expect(back.fileWrappers?["Image.png"]?.regularFileContents == image)

        // Editing only the text leaves the image file alone.
        let imageInode = try FileFacts(url.appendingPathComponent("Image.png").path).inode
        let oldText = try #require(back.fileWrappers?["Text.txt"])
        back.removeFileWrapper(oldText)
        back.addRegularFile(withContents: Data("Remember the eggs.\n".utf8), preferredFilename: "Text.txt")
        try back.write(to: url, options: .atomic, originalContentsURL: url)
        #expect(try FileFacts(url.appendingPathComponent("Image.png").path).inode == imageInode)
        #expect(
            try String(contentsOf: url.appendingPathComponent("Text.txt"), encoding: .utf8)
                == "Remember the eggs.\n")
    }
}
