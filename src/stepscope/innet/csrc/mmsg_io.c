/* Many datagrams per system call (the C side of wire/batch_io.py, same behaviour):
 * recv_batch: one recvmmsg into a preallocated buffer; a GRO train (one message holding equal-size datagrams,
 *   its segment size in a UDP_GRO control message) is cut into its datagrams; a datagram cut short by a too
 *   small buffer has length -1; the sender of each as (IPv4 address << 16 | port).
 * send_batch: a queue of datagrams (addresses in memory that outlives the call), grouped by destination
 *   (stable), equal-size runs to one peer sent as one GSO message (at most 64 datagrams, 65,507 bytes), by
 *   sendmmsg calls; a message the kernel will not take after waiting 1 ms is dropped and counted, as a switch
 *   drops it (the protocol retransmits). The interpreter lock is released around the system calls. */
#define _GNU_SOURCE
#include "fastpath.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>

#define SOL_UDP_ 17
#define UDP_SEGMENT_ 103
#define UDP_GRO_ 104
#define MAX_SEGMENTS 64
#define MAX_UDP_PAYLOAD 65507
#define CONTROL_BYTES CMSG_SPACE(sizeof(int))

Py_ssize_t recv_into(int fd, uint8_t *buffer, int messages, Py_ssize_t message_bytes, int gro, int64_t *offsets,
                     int64_t *lengths, uint64_t *sources, Py_ssize_t capacity) {
    struct mmsghdr msgs[MAX_MESSAGES];
    struct iovec iov[MAX_MESSAGES];
    struct sockaddr_in names[MAX_MESSAGES];
    uint8_t control[MAX_MESSAGES][CONTROL_BYTES] __attribute__((aligned(8)));
    memset(msgs, 0, sizeof(struct mmsghdr) * messages);
    for (int i = 0; i < messages; i++) {
        iov[i].iov_base = buffer + (size_t)i * message_bytes;
        iov[i].iov_len = message_bytes;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        if (gro) {
            msgs[i].msg_hdr.msg_control = control[i];
            msgs[i].msg_hdr.msg_controllen = CONTROL_BYTES;
        }
        if (sources) {
            msgs[i].msg_hdr.msg_name = &names[i];
            msgs[i].msg_hdr.msg_namelen = sizeof(struct sockaddr_in);
        }
    }
    int count = recvmmsg(fd, msgs, messages, MSG_DONTWAIT, NULL);
    if (count < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -errno;
    Py_ssize_t out = 0;
    for (int i = 0; i < count; i++) {
        int64_t length = msgs[i].msg_len, segment = length;
        if (gro) {
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
                if (c->cmsg_level == SOL_UDP_ && c->cmsg_type == UDP_GRO_ && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
                    int size;
                    memcpy(&size, CMSG_DATA(c), sizeof size);
                    if (size > 0)
                        segment = size < (length > 1 ? length : 1) ? size : (length > 1 ? length : 1);
                }
            }
        }
        if (segment < 1)
            segment = 1;
        int64_t pieces = (length + segment - 1) / segment;
        if (pieces < 1)
            pieces = 1; /* an empty datagram is still one datagram */
        int truncated = (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
        uint64_t key = 0;
        if (sources) {
            const uint8_t *a = (const uint8_t *)&names[i].sin_addr.s_addr, *p = (const uint8_t *)&names[i].sin_port;
            key = ((uint64_t)a[0] << 40) | ((uint64_t)a[1] << 32) | ((uint64_t)a[2] << 24) | ((uint64_t)a[3] << 16) |
                  ((uint64_t)p[0] << 8) | p[1];
        }
        /* capacity: GRO_SEGMENTS per message, the kernel's most segments in one */
        for (int64_t j = 0; j < pieces && out < capacity; j++, out++) {
            offsets[out] = (int64_t)i * message_bytes + j * segment;
            int64_t size = length - j * segment;
            lengths[out] = truncated ? -1 : (size < segment ? size : segment);
            if (sources)
                sources[out] = key;
        }
    }
    return out;
}

PyObject *fp_recv_batch(PyObject *self, PyObject *args) {
    int fd, messages, gro;
    Py_ssize_t message_bytes;
    PyObject *buffer_obj, *offsets_obj, *lengths_obj, *sources_obj;
    if (!PyArg_ParseTuple(args, "iOinpOOO", &fd, &buffer_obj, &messages, &message_bytes, &gro, &offsets_obj,
                          &lengths_obj, &sources_obj))
        return NULL;
    if (messages < 1 || messages > MAX_MESSAGES || message_bytes < 1)
        return PyErr_Format(PyExc_ValueError, "recv_batch: 1..%d messages", MAX_MESSAGES);
    Py_buffer vb, vo, vl, vs;
    int got = 0;
    uint8_t *buffer = array_of(buffer_obj, &vb, 1, messages * message_bytes, 1, 'u');
    got += buffer != NULL;
    int64_t *offsets = buffer ? array_of(offsets_obj, &vo, 8, 1, 1, 'i') : NULL;
    got += offsets != NULL;
    int64_t *lengths = offsets ? array_of(lengths_obj, &vl, 8, vo.len / 8, 1, 'i') : NULL;
    got += lengths != NULL;
    uint64_t *sources = NULL;
    if (lengths && sources_obj != Py_None)
        got += (sources = array_of(sources_obj, &vs, 8, vo.len / 8, 1, 'u')) != NULL;
    PyObject *out = NULL;
    if (lengths && (sources_obj == Py_None || sources)) {
        Py_ssize_t count;
        Py_BEGIN_ALLOW_THREADS
        count = recv_into(fd, buffer, messages, message_bytes, gro, offsets, lengths, sources, vo.len / 8);
        Py_END_ALLOW_THREADS
        out = PyLong_FromSsize_t(count);
    }
    if (got > 0) PyBuffer_Release(&vb);
    if (got > 1) PyBuffer_Release(&vo);
    if (got > 2) PyBuffer_Release(&vl);
    if (got > 3) PyBuffer_Release(&vs);
    return out;
}

/* Messages of a send: runs of equal length to one destination, cut at GSO's limits (or one datagram each). */
static Py_ssize_t trains(const int64_t *length, const int64_t *dest, Py_ssize_t count, int gso, Py_ssize_t *start,
                         Py_ssize_t *size) {
    Py_ssize_t messages = 0;
    for (Py_ssize_t i = 0; i < count;) {
        Py_ssize_t limit = 1;
        if (gso) {
            limit = MAX_UDP_PAYLOAD / (length[i] > 1 ? length[i] : 1);
            limit = limit < 1 ? 1 : (limit > MAX_SEGMENTS ? MAX_SEGMENTS : limit);
        }
        Py_ssize_t j = i + 1;
        while (j < count && j - i < limit && dest[j] == dest[i] && length[j] == length[i])
            j++;
        start[messages] = i;
        size[messages++] = j - i;
        i = j;
    }
    return messages;
}

/* Stable order of the queue by destination (-1, the connected peer, first): a counting sort. */
static int group_by_destination(uint64_t *ptr, int64_t *length, int64_t *dest, Py_ssize_t count) {
    int64_t top = -1;
    int mixed = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        top = dest[i] > top ? dest[i] : top;
        mixed |= dest[i] != dest[0];
    }
    if (!mixed)
        return 0;
    Py_ssize_t buckets = (Py_ssize_t)top + 2;
    Py_ssize_t *first = calloc(buckets + 1, sizeof *first);
    uint64_t *p2 = malloc(count * sizeof *p2);
    int64_t *l2 = malloc(count * sizeof *l2), *d2 = malloc(count * sizeof *d2);
    if (!first || !p2 || !l2 || !d2) {
        free(first), free(p2), free(l2), free(d2);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        first[dest[i] + 2]++;
    for (Py_ssize_t b = 1; b <= buckets; b++)
        first[b] += first[b - 1];
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t at = first[dest[i] + 1]++;
        p2[at] = ptr[i], l2[at] = length[i], d2[at] = dest[i];
    }
    memcpy(ptr, p2, count * sizeof *p2);
    memcpy(length, l2, count * sizeof *l2);
    memcpy(dest, d2, count * sizeof *d2);
    free(first), free(p2), free(l2), free(d2);
    return 0;
}

int send_queue(int fd, uint64_t *ptr, int64_t *length, int64_t *dest, Py_ssize_t count, const uint8_t *names,
               int *gso, long long *sent, long long *dropped, int *code) {
    *sent = *dropped = 0;
    *code = 0;
    if (count <= 0)
        return 0;
    struct iovec *iov = malloc(count * sizeof *iov);
    struct mmsghdr *msgs = malloc(count * sizeof *msgs);
    uint8_t *control = malloc(count * CMSG_SPACE(sizeof(uint16_t)));
    Py_ssize_t *start = malloc(count * sizeof *start), *size = malloc(count * sizeof *size);
    if (!iov || !msgs || !control || !start || !size || group_by_destination(ptr, length, dest, count) < 0) {
        free(iov), free(msgs), free(control), free(start), free(size);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        iov[i].iov_base = (void *)(uintptr_t)ptr[i];
        iov[i].iov_len = (size_t)length[i];
    }
    Py_ssize_t done_datagrams = 0; /* datagrams before the first message of this round */
    while (done_datagrams < count) {
        Py_ssize_t messages = trains(length + done_datagrams, dest + done_datagrams, count - done_datagrams, *gso,
                                     start, size);
        memset(msgs, 0, messages * sizeof *msgs);
        for (Py_ssize_t m = 0; m < messages; m++) {
            Py_ssize_t at = done_datagrams + start[m];
            struct msghdr *h = &msgs[m].msg_hdr;
            h->msg_iov = &iov[at];
            h->msg_iovlen = size[m];
            if (dest[at] >= 0) {
                h->msg_name = (void *)(names + dest[at] * sizeof(struct sockaddr_in));
                h->msg_namelen = sizeof(struct sockaddr_in);
            }
            if (size[m] > 1) {
                uint8_t *c = control + m * CMSG_SPACE(sizeof(uint16_t));
                memset(c, 0, CMSG_SPACE(sizeof(uint16_t)));
                h->msg_control = c;
                h->msg_controllen = CMSG_SPACE(sizeof(uint16_t));
                struct cmsghdr *cm = CMSG_FIRSTHDR(h);
                cm->cmsg_level = SOL_UDP_;
                cm->cmsg_type = UDP_SEGMENT_;
                cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t segment = (uint16_t)length[at];
                memcpy(CMSG_DATA(cm), &segment, sizeof segment);
            }
        }
        Py_ssize_t m = 0;
        int restart = 0;
        while (m < messages) {
            int result = sendmmsg(fd, msgs + m, (unsigned)(messages - m > 1024 ? 1024 : messages - m), MSG_DONTWAIT);
            if (result > 0) {
                for (int r = 0; r < result; r++)
                    *sent += size[m + r];
                m += result;
                continue;
            }
            int error = errno;
            if (error == EINTR)
                continue;
            if (error == EAGAIN || error == EWOULDBLOCK || error == ENOBUFS) {
                struct pollfd pfd = {fd, POLLOUT, 0};
                if (poll(&pfd, 1, 1) > 0)
                    continue; /* room again after a moment */
            }
            if ((error == EINVAL || error == EIO) && *gso) {
                int trained = 0;
                for (Py_ssize_t r = m; r < messages; r++)
                    trained |= size[r] > 1;
                if (trained) { /* this path cannot segment: plain datagrams from here on */
                    *gso = 0;
                    done_datagrams += start[m];
                    restart = 1;
                    break;
                }
            }
            if (error == ECONNREFUSED) {
                *code = error;
                break;
            }
            *dropped += size[m]; /* this message cannot go now: dropped, the next ones are tried */
            m++;
        }
        if (*code)
            break;
        if (!restart)
            done_datagrams = count;
    }
    free(iov), free(msgs), free(control), free(start), free(size);
    return 0;
}

PyObject *fp_send_batch(PyObject *self, PyObject *args) {
    int fd, gso;
    Py_ssize_t count;
    PyObject *ptr_obj, *len_obj, *dest_obj, *names_obj;
    if (!PyArg_ParseTuple(args, "iOOOnOp", &fd, &ptr_obj, &len_obj, &dest_obj, &count, &names_obj, &gso))
        return NULL;
    Py_buffer vp, vl, vd, vn;
    int got = 0;
    uint64_t *ptr = array_of(ptr_obj, &vp, 8, count, 1, 0);
    got += ptr != NULL;
    int64_t *length = ptr ? array_of(len_obj, &vl, 8, count, 1, 'i') : NULL;
    got += length != NULL;
    int64_t *dest = length ? array_of(dest_obj, &vd, 8, count, 1, 'i') : NULL;
    got += dest != NULL;
    uint8_t *names = dest ? array_of(names_obj, &vn, 1, 0, 0, 'u') : NULL;
    got += names != NULL;
    PyObject *out = NULL;
    if (names != NULL) {
        Py_ssize_t book = vn.len / sizeof(struct sockaddr_in);
        int outside = 0;
        for (Py_ssize_t i = 0; i < count; i++)
            outside |= dest[i] < -1 || dest[i] >= book;
        long long sent = 0, dropped = 0;
        int code = 0, failed = 0;
        if (outside) {
            PyErr_SetString(PyExc_ValueError, "send_batch: a destination outside the address book");
        } else {
            Py_BEGIN_ALLOW_THREADS
            failed = send_queue(fd, ptr, length, dest, count, names, &gso, &sent, &dropped, &code);
            Py_END_ALLOW_THREADS
            out = failed ? PyErr_NoMemory() : Py_BuildValue("LLii", sent, dropped, gso, code);
        }
    }
    if (got > 0) PyBuffer_Release(&vp);
    if (got > 1) PyBuffer_Release(&vl);
    if (got > 2) PyBuffer_Release(&vd);
    if (got > 3) PyBuffer_Release(&vn);
    return out;
}
